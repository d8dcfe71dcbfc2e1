"""Kill real `bulkinfer run` processes and check the output contract afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import cli, make_catalog, read_output, tabular_table, train_classifier, wait_commits, write

SLOW_ADAPTER = textwrap.dedent("""
    import os
    import time
    from bulkinfer import Adapter

    class Slow(Adapter):
        input_columns = ("x1",)

        def predict(self, batch):
            if os.path.exists("hold"):  # the test holds the run mid-job: it says so, then waits
                open("started", "w").close()
                while os.path.exists("hold"):
                    time.sleep(0.01)
            time.sleep(0.05)
            return {"y": [v * 2 for v in batch["x1"].to_pylist()]}
""")


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "bulkinfer", "run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _visible_parts_are_complete(out: Path) -> None:
    for p in out.iterdir():
        if p.is_file() and not p.name.startswith(("_", ".")):
            pq.read_table(p)  # raises on a half-written file


def test_sigkill_mid_run_then_rerun_equals_clean_run(tmp_path):
    write(make_catalog(420, seed=11), tmp_path / "in.parquet", row_group_size=60)
    args = [
        "-i",
        "in.parquet",
        "-m",
        "minilm",
        "--text-column",
        "description",
        "--id-column",
        "id",
        "--keep-columns",
        "category",
        "--shard-rows",
        "60",
        "--progress",
        "none",
    ]
    proc = _start([*args, "-o", "out"], tmp_path)
    wait_commits(tmp_path / "out", 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _visible_parts_are_complete(tmp_path / "out")
    committed_before = (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text().count("\n")
    assert 2 <= committed_before < 7, "the kill should land mid-run"
    resumed = cli("run", *args, "-o", "out", cwd=tmp_path, check=True)
    assert f"({committed_before * 60} already committed)" in resumed.stdout
    cli("run", *args, "-o", "clean", cwd=tmp_path, check=True)
    got, clean = read_output(tmp_path / "out"), read_output(tmp_path / "clean")
    assert got["id"].to_pylist() == clean["id"].to_pylist() == list(range(420))
    assert got["category"].to_pylist() == clean["category"].to_pylist()
    a = np.stack(got["embedding"].to_numpy(zero_copy_only=False))
    b = np.stack(clean["embedding"].to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(a, b, atol=1e-5)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["_SUCCESS", "_bulkinfer", *[f"part-{i:05d}.parquet" for i in range(7)]]


@pytest.fixture()
def slow_job(tmp_path):
    (tmp_path / "slowmodel.py").write_text(SLOW_ADAPTER)
    write(tabular_table(1200), tmp_path / "in.parquet", row_group_size=100)
    return tmp_path, [
        "-i",
        "in.parquet",
        "-m",
        "slowmodel:Slow",
        "--id-column",
        "id",
        "--shard-rows",
        "100",
        "--batch-size",
        "20",
        "-o",
        "out",
        "--progress",
        "none",
    ]


def test_sigterm_exits_75_and_resume_finishes(slow_job):
    cwd, args = slow_job
    proc = _start(args, cwd)
    wait_commits(cwd / "out", 1, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert time.monotonic() - t0 < 10
    assert "rerun the same command to resume" in err and "Traceback" not in err
    assert not (cwd / "out" / "_SUCCESS").exists()
    report = (cwd / "out" / "_bulkinfer" / "report.json").read_text()
    assert '"status": "interrupted"' in report
    cli("run", *args, cwd=cwd, check=True)
    out = read_output(cwd / "out")
    assert out["id"].to_pylist() == list(range(1200))
    assert out["y"].to_pylist() == pytest.approx([2 * x for x in tabular_table(1200)["x1"].to_pylist()])


def test_concurrent_run_refused_and_dead_lock_taken_over(slow_job):
    cwd, args = slow_job
    (cwd / "hold").touch()  # the first run stays in its first model call until the test lets go
    first = _start(args, cwd)
    deadline = time.monotonic() + 120
    while not (cwd / "started").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.02)
    second = cli("run", *args, cwd=cwd)
    assert second.returncode == 1
    assert "another run is writing here" in second.stderr and f'"pid": {first.pid}' in second.stderr
    first.send_signal(signal.SIGKILL)
    first.wait()
    (cwd / "hold").unlink()
    third = cli("run", *args, cwd=cwd, check=True)
    assert "took over the lock left by a run that died" in third.stderr
    assert read_output(cwd / "out")["id"].to_pylist() == list(range(1200))


def test_changed_input_or_model_is_refused_unless_overwrite(tmp_path, monkeypatch):
    from bulkinfer import load_config, run_job
    from bulkinfer.core.errors import JobMismatchError

    write(tabular_table(300), tmp_path / "in.parquet")
    train_classifier(tmp_path / "m.joblib")
    args = ["-i", "in.parquet", "-m", "m.joblib", "--id-column", "id", "-o", "out", "--progress", "none"]
    cli("run", *args, cwd=tmp_path, check=True)
    write(tabular_table(300, seed=42), tmp_path / "in.parquet")
    changed = cli("run", *args, cwd=tmp_path)  # the command's own answer: one line, exit 1
    assert changed.returncode == 1
    assert (
        "holds a different job (input " in changed.stderr
        and "in.parquet changed)" in changed.stderr
        and "--overwrite" in changed.stderr
    )
    monkeypatch.chdir(tmp_path)  # the same job in-process from here (the CLI is the same run_job)

    def run(**extra: object) -> None:
        base = {"source.paths": ["in.parquet"], "model.name": "m.joblib", "source.id_column": "id",
                "sink.path": "out", "execution.progress": "none"}  # fmt: skip
        run_job(load_config(overrides={**base, **extra}))

    run(**{"execution.overwrite": True})
    train_classifier(tmp_path / "m.joblib", kind="lightgbm")
    with pytest.raises(JobMismatchError, match="the model changed"):
        run()
    run(**{"execution.overwrite": True})
    with pytest.raises(JobMismatchError, match="source.shard_rows"):
        run(**{"source.shard_rows": 7})
    # settings that do not change the output may change between runs
    run(**{"runtime.batch_size": 3, "execution.overwrite": True})
    run(**{"runtime.batch_size": 5})
    assert pa.Table.equals(read_output(tmp_path / "out").select(["id"]), tabular_table(300).select(["id"]))


def test_sigterm_on_the_bundled_model_exits_75_within_10s(tmp_path):
    write(make_catalog(900, seed=2), tmp_path / "in.parquet")
    args = [
        "-i",
        "in.parquet",
        "-m",
        "minilm",
        "--text-column",
        "description",
        "--id-column",
        "id",
        "--shard-rows",
        "300",
        "--set",
        "runtime.sort_window=64",
        "--progress",
        "none",
        "-o",
        "out",
    ]
    proc = _start(args, tmp_path)
    wait_commits(tmp_path / "out", 1, proc)  # the first shard is in; 600 rows (seconds of work) remain
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert time.monotonic() - t0 < 10
    commits = [
        json.loads(line.split(" ", 1)[1])
        for line in (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text().splitlines()
    ]
    assert sum(c["stop"] - c["start"] for c in commits) < 900
    for c in commits:  # a partial commit covers whole windows of its shard
        assert c["stop"] % 300 == 0 or (c["stop"] - c["start"]) % 64 == 0
    cli("run", *args, cwd=tmp_path, check=True)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(900))
