"""What the README promises of a run that no other test holds it to: a second signal exits at
once, resume without an id column, several inputs, `limit_rows`, `preserve_order = false`,
`metrics.prom`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bulkinfer import run_job
from bulkinfer.core.errors import Interrupted

from helpers import cli, job_config, read_output, stop_after_commits, tabular_table, write

MODELS = textwrap.dedent("""
    import os
    import time

    import pyarrow.compute as pc

    from bulkinfer import Adapter


    def double(table):
        return {"y": pc.multiply(table["x1"], 2)}


    def slow_double(table):
        time.sleep(0.02)
        return {"y": pc.multiply(table["x1"], 2)}


    class Held(Adapter):
        '''Doubles x1; while the file "hold" exists its first call says so ("started") and waits.'''

        input_columns = ("x1",)

        def predict(self, batch):
            if os.path.exists("hold"):
                open("started", "w").close()
                while os.path.exists("hold"):
                    time.sleep(0.01)
            return {"y": [2 * v for v in batch["x1"].to_pylist()]}


    class SlowToLoad(Adapter):
        '''Doubles x1; while the file "hold" exists its loading says so ("loading") and waits.'''

        input_columns = ("x1",)

        def setup(self, ctx):
            open("loading", "w").close()
            while os.path.exists("hold"):
                time.sleep(0.01)

        def predict(self, batch):
            open("predicted", "w").close()
            return {"y": [2 * v for v in batch["x1"].to_pylist()]}


    class ByLength(Adapter):
        '''A model whose cost is a text's length: batches are formed from length-sorted rows.'''

        input_columns = ("text",)

        def preprocess(self, table):
            return [len(t) for t in table["text"].to_pylist()]

        def cost(self, features):
            return features

        def predict(self, batch):
            return {"n": list(batch)}
""")


@pytest.fixture()
def models(tmp_path, monkeypatch):
    name = f"contract_{os.getpid()}_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _cfg(tmp_path, paths, **extra):
    return job_config(tmp_path / "out", paths, **{"source.id_column": None, **extra})


def test_a_second_signal_exits_at_once_and_nothing_half_written_is_visible(tmp_path, models):
    write(tabular_table(600), tmp_path / "in.parquet", row_group_size=100)
    (tmp_path / "hold").touch()  # the run's first model call waits until the test lets go
    args = ["run", "-i", "in.parquet", "-m", f"{models}:Held", "--id-column", "id", "--shard-rows", "100",
            "-o", "out", "--progress", "none"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "bulkinfer", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, lines
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # first: finish the call in flight (which waits on "hold")
    while not any("send again to exit now" in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, lines
        time.sleep(0.02)
    time.sleep(0.3)
    assert proc.poll() is None  # still waiting for the call in flight, as the first signal asks
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # second: leave now
    assert proc.wait(timeout=30) == 75
    assert time.monotonic() - t0 < 5
    reader.join(timeout=5)
    visible = [p for p in (tmp_path / "out").iterdir() if not p.name.startswith(("_", "."))]
    assert all(pq.read_table(p).num_rows > 0 for p in visible)  # any part in sight is whole
    (tmp_path / "hold").unlink()
    cli(*args, cwd=tmp_path, env=env, check=True)
    out = read_output(tmp_path / "out")
    assert out["id"].to_pylist() == list(range(600))


def test_a_signal_while_the_model_loads_exits_75_having_inferred_nothing(tmp_path, models):
    """SIGTERM lands before any shard started (the model is loading): the run exits 75 like
    one stopped mid-run, not killed by the signal, and infers nothing; a rerun does it all."""
    write(tabular_table(300), tmp_path / "in.parquet", row_group_size=100)
    (tmp_path / "hold").touch()
    args = ["run", "-i", "in.parquet", "-m", f"{models}:SlowToLoad", "--id-column", "id", "--shard-rows", "100",
            "-o", "out", "--progress", "none"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "bulkinfer", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "loading").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    (tmp_path / "hold").unlink()  # loading ends; the run must see the signal and take no work
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "interrupted; committed rows are kept" in err
    assert "bulkinfer: stopped: " in err and "error" not in err  # a stop a rerun resumes is not an error
    assert not (tmp_path / "predicted").exists()
    assert not (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text().strip()
    cli(*args, cwd=tmp_path, env=env, check=True)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(300))


def test_resume_without_an_id_column_writes_every_row_once_in_input_order(tmp_path, models):
    t = tabular_table(1000).drop_columns(["id"])
    write(t, tmp_path / "in.parquet", row_group_size=100)
    cfg = _cfg(tmp_path, [tmp_path / "in.parquet"], **{
        "model.name": f"{models}:slow_double", "model.feature_columns": ["x1"], "source.shard_rows": 100,
        "runtime.batch_size": 20,
    })  # fmt: skip
    with pytest.raises(Interrupted, match="rerun the same command to resume"):
        run_job(cfg, stop=stop_after_commits(tmp_path / "out", 3))
    done = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())["rows_out"]
    assert 300 <= done < 1000
    second = run_job(cfg)
    assert second.report["rows_already_done"] == done and second.report["rows_out"] == 1000 - done
    out = read_output(tmp_path / "out")
    assert out.column_names == ["y"]  # no id column: the rows are known by their place
    assert out["y"].to_pylist() == [2 * x for x in t["x1"].to_pylist()]


def test_several_inputs_limit_rows_and_metrics_prom(tmp_path, models):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write(tabular_table(300), tmp_path / "a" / "x.parquet", row_group_size=100)
    write(tabular_table(200, seed=1, start=300), tmp_path / "b" / "y.parquet", row_group_size=100)
    common = ["-m", f"{models}:double", "--feature-columns", "x1", "--id-column", "id", "--shard-rows", "100",
              "--progress", "none"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli("run", "-i", "a/x.parquet", "-i", "b/*.parquet", *common, "-o", "both", cwd=tmp_path, env=env, check=True)
    both = read_output(tmp_path / "both")
    assert sorted(both["id"].to_pylist()) == list(range(500))  # every row of both inputs, once

    cli("run", "-i", "a/x.parquet", "-i", "b/*.parquet", *common, "--limit-rows", "250", "-o", "some",
        cwd=tmp_path, env=env, check=True)  # fmt: skip
    some = read_output(tmp_path / "some")
    assert some["id"].to_pylist() == list(range(250))  # the first 250 planned rows
    report = json.loads((tmp_path / "some" / "_bulkinfer" / "report.json").read_text())
    assert (report["rows_planned"], report["rows_out"]) == (250, 250)

    # metrics.prom: the report's figures, in Prometheus text format
    prom = (tmp_path / "some" / "_bulkinfer" / "metrics.prom").read_text()
    samples = {
        (s.name, s.labels.get("stage")): s.value for f in text_string_to_metric_families(prom) for s in f.samples
    }
    assert samples[("bulkinfer_rows_out", None)] == 250
    assert samples[("bulkinfer_rows_failed", None)] == 0
    assert samples[("bulkinfer_wall_seconds", None)] == pytest.approx(report["wall_s"])
    assert samples[("bulkinfer_rows_per_second", None)] == pytest.approx(report["rows_per_s"])
    stages = {stage: v for (name, stage), v in samples.items() if name == "bulkinfer_stage_seconds"}
    assert stages == pytest.approx(report["time_s"])


def test_preserve_order_false_keeps_the_batches_order(tmp_path, models):
    rng = np.random.default_rng(5)
    texts = ["x" * int(n) for n in rng.integers(1, 60, size=120)]
    write(pa.table({"id": np.arange(120), "text": texts}), tmp_path / "in.parquet")
    common = {"model.name": f"{models}:ByLength", "source.id_column": "id", "runtime.batch_size": 16,
              "runtime.sort_window": 1000}  # fmt: skip
    run_job(_cfg(tmp_path, [tmp_path / "in.parquet"], **common))
    kept = read_output(tmp_path / "out")
    assert kept["id"].to_pylist() == list(range(120))  # the default restores input order
    cfg = _cfg(tmp_path, [tmp_path / "in.parquet"], **common, **{"sink.preserve_order": False,
               "sink.path": str(tmp_path / "unordered")})  # fmt: skip
    run_job(cfg)
    got = read_output(tmp_path / "unordered")
    # rows come in the order they were batched: by length, ties in input order
    assert got["id"].to_pylist() == sorted(range(120), key=lambda i: len(texts[i]))
    assert got["n"].to_pylist() == [len(texts[i]) for i in got["id"].to_pylist()]
