"""``_bulkinfer/stats.json``: the statistics of exactly the committed rows, whether the run was
clean, stopped and resumed, or killed outright; and drift against a baseline run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from bulkinfer import load_config, run_job
from bulkinfer.core.errors import Interrupted

from helpers import cli, read_output, stop_after_commits, tabular_table, train_classifier, write

EXACT = ("kind", "count", "nulls", "nan", "inf", "min", "max", "classes")


def job(tmp_path: Path, out: str, inp: str = "in.parquet") -> dict[str, object]:
    return {
        "source.paths": [str(tmp_path / inp)],
        "model.name": str(tmp_path / "m.joblib"),
        "source.id_column": "id",
        "sink.path": str(tmp_path / out),
        "source.shard_rows": 500,
        "runtime.batch_size": 128,
        "execution.progress": "none",
    }


@pytest.fixture
def data(tmp_path: Path) -> Path:
    train_classifier(tmp_path / "m.joblib")
    write(tabular_table(3000, seed=2), tmp_path / "in.parquet", row_group_size=250)
    return tmp_path


def stats_of(out: Path) -> dict:
    return json.loads((out / "_bulkinfer" / "stats.json").read_text())


def assert_describes(stats: dict, out: Path) -> None:
    """stats.json describes exactly the rows a reader sees in ``out``."""
    table = read_output(out)
    assert stats["rows"] == table.num_rows
    assert set(stats["columns"]) == {"prediction", "proba_no", "proba_yes"}  # not the id
    labels = table["prediction"].to_pylist()
    assert stats["columns"]["prediction"]["classes"] == {c: labels.count(c) for c in sorted(set(labels))}
    p = table["proba_yes"].to_numpy()
    s = stats["columns"]["proba_yes"]
    assert (s["count"], s["min"], s["max"]) == (len(p), p.min(), p.max())
    assert math.isclose(s["mean"], p.mean(), rel_tol=1e-12) and math.isclose(s["std"], p.std(), rel_tol=1e-9)


def same_figures(a: dict, b: dict) -> None:
    assert a["rows"] == b["rows"] and set(a["columns"]) == set(b["columns"])
    for name, col in a["columns"].items():
        for key in EXACT:
            assert col.get(key) == b["columns"][name].get(key), (name, key)
        if col.get("mean") is not None:
            assert math.isclose(col["mean"], b["columns"][name]["mean"], rel_tol=1e-12)


def test_stats_of_a_resumed_run_equal_a_clean_runs(data):
    tmp_path = data
    run_job(load_config(overrides=job(tmp_path, "clean")))
    clean = stats_of(tmp_path / "clean")
    assert_describes(clean, tmp_path / "clean")
    assert clean["state"]["covers"] == [f"part-{i:05d}.parquet" for i in range(6)]

    # stopped after two commits (SIGTERM's path): stats.json keeps the committed parts' statistics
    stop = stop_after_commits(tmp_path / "stopped", 2)
    cfg = load_config(overrides={**job(tmp_path, "stopped"), "runtime.batch_size": 16})
    with pytest.raises(Interrupted):
        run_job(cfg, stop=stop)
    partial = stats_of(tmp_path / "stopped")
    assert partial["rows"] == read_output(tmp_path / "stopped").num_rows < 3000
    assert_describes(partial, tmp_path / "stopped")
    run_job(cfg)
    resumed = stats_of(tmp_path / "stopped")
    same_figures(resumed, clean)
    assert_describes(resumed, tmp_path / "stopped")


def test_stats_after_a_kill_are_rebuilt_from_the_committed_parts(data):
    tmp_path = data
    args = [f"--set={k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in job(tmp_path, "out").items()]
    env = {**os.environ, "BULKINFER_CRASH_AT": "exported:4"}  # SIGKILL before the 4th commit: 3 committed
    proc = cli("run", *args, env=env)
    assert proc.returncode == -9, proc.stderr
    assert not (tmp_path / "out" / "_bulkinfer" / "stats.json").exists()
    cli("run", *args, check=True)
    stats = stats_of(tmp_path / "out")
    assert stats["rows"] == 3000 and len(stats["state"]["covers"]) == 6
    assert_describes(stats, tmp_path / "out")


def test_drift_against_a_baseline_and_fail_on_drift(data):
    tmp_path = data
    base = job(tmp_path, "base")
    run_job(load_config(overrides=base))
    same = run_job(load_config(overrides={**job(tmp_path, "same"), "monitor.baseline": str(tmp_path / "base")}))
    # the same rows: only the sketches' randomised compaction tells the two runs apart
    assert same.report["drift"]["status"] == "ok" and same.report["drift"]["worst_psi"] < 0.01

    shifted = tabular_table(3000, seed=2)
    x1 = shifted["x1"].to_numpy() + 2.0  # every row now leans to "yes"
    shifted = shifted.set_column(shifted.column_names.index("x1"), "x1", [x1])
    write(shifted, tmp_path / "shifted.parquet")
    args = [f"--set={k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in
            job(tmp_path, "new", "shifted.parquet").items()]  # fmt: skip
    proc = cli("run", *args, "--baseline", str(tmp_path / "base"), "--fail-on-drift")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "drift against" in line and "prediction PSI" in line and "committed and kept" in line
    assert (tmp_path / "new" / "_SUCCESS").exists() and read_output(tmp_path / "new").num_rows == 3000
    report = json.loads((tmp_path / "new" / "_bulkinfer" / "report.json").read_text())
    pred = report["drift"]["columns"]["prediction"]
    old = stats_of(tmp_path / "base")["columns"]["prediction"]["classes"]
    new = stats_of(tmp_path / "new")["columns"]["prediction"]["classes"]
    assert pred["share_change"]["yes"] == pytest.approx(new["yes"] / 3000 - old["yes"] / 3000, abs=1e-6)
    assert report["drift"]["status"] == "drift" and "prediction" in report["drift"]["over"]

    missing = cli("run", *args, "--baseline", str(tmp_path / "nowhere"), "--set=sink.path=" + str(tmp_path / "x"))
    assert missing.returncode == 1 and "monitor.baseline" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "x" / "_SUCCESS").exists()
    assert np.isfinite(pred["psi"])


def test_stats_are_saved_as_parts_commit_so_a_resume_after_a_kill_rereads_few_parts(data, monkeypatch):
    """stats.json is saved while the job runs (every STATS_EVERY_S; here after every commit) and
    always describes committed parts only, so a resume after a kill recomputes only the parts
    committed since."""
    import bulkinfer.commit.committer as committer

    tmp_path = data
    monkeypatch.setattr(committer, "STATS_EVERY_S", 0.0)
    monkeypatch.setattr(committer, "STATS_SPACING", 0)
    saved = tmp_path / "out" / "_bulkinfer" / "stats.json"
    seen: list[list[str] | None] = []
    run_job(load_config(overrides=job(tmp_path, "out")), on_commit=lambda _s: seen.append(
        json.loads(saved.read_text())["state"]["covers"] if saved.exists() else None))  # fmt: skip
    assert seen == [[f"part-{i:05d}.parquet" for i in range(k + 1)] for k in range(6)]
    assert_describes(stats_of(tmp_path / "out"), tmp_path / "out")
