"""A job as a scheduler's task: a real Airflow (``airflow dags test`` on examples/airflow's DAG,
SQLite metadata) and a real Dagster (``materialize``). In each, the job is stopped by SIGTERM on
its first try (as a drained worker stops it): the try exits 75, the scheduler retries, the retry
resumes, and every row is in the output once; the report reaches XCom / the asset's metadata."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer.config.load import toml_value

from helpers import read_output, write

ROOT = Path(__file__).resolve().parents[2]
ROWS = 400
MODEL = textwrap.dedent("""
    import time
    import pyarrow.compute as pc

    def slow_double(table):
        time.sleep(0.005 * table.num_rows)
        return {"y": pc.multiply(table["x"], 2)}
""")


def _job(tmp_path: Path) -> Path:
    (tmp_path / "orchmodel.py").write_text(MODEL)
    write(pa.table({"id": np.arange(ROWS), "x": np.arange(ROWS)}), tmp_path / "in.parquet", row_group_size=25)
    job = tmp_path / "job.toml"
    job.write_text(
        textwrap.dedent(f"""
        [source]
        paths = ["{tmp_path / "in.parquet"}"]
        id_column = "id"
        shard_rows = 25

        [model]
        name = "orchmodel:slow_double"
        feature_columns = ["x"]

        [sink]
        path = "{tmp_path / "unused"}"
    """)
    )
    return job


def _stop_first_try(out: Path) -> threading.Thread:
    """SIGTERM the first `bulkinfer run` writing ``out`` once it has committed two shards."""

    def watch() -> None:
        log = out / "_bulkinfer" / "commits.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and log.read_text().count("\n") >= 2:
                for pid in _bulkinfer_runs(str(out)):
                    os.kill(pid, signal.SIGTERM)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _bulkinfer_runs(marker: str) -> list[int]:
    found = []
    for p in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in cmd]
        if "bulkinfer" in words and "run" in words and any(marker in w for w in words):
            found.append(int(p))
    return found


def _every_row_once(out: Path) -> None:
    got = read_output(out)
    assert sorted(got["id"].to_pylist()) == list(range(ROWS))
    assert dict(zip(got["id"].to_pylist(), got["y"].to_pylist(), strict=True)) == {i: 2 * i for i in range(ROWS)}


def test_overrides_become_toml_values_of_their_own_type():
    assert toml_value("007") == '"007"'  # a string that looks like a number stays a string
    assert toml_value(True) == "true" and toml_value(0.5) == "0.5" and toml_value(3) == "3"
    assert toml_value(["a", 1]) == '["a", 1]'
    assert toml_value({"k": "v"}) == '{"k" = "v"}'
    import tomllib

    text = 'é "q" \\ 🙂\n'
    assert tomllib.loads("v = " + toml_value(text))["v"] == text
    with pytest.raises(TypeError):
        toml_value(object())


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "examples" / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "0",
        "HF_HUB_OFFLINE": "1",
    }
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return airflow, env


def test_airflow_retries_a_stopped_job_and_the_retry_resumes(tmp_path, airflow_home):
    airflow, env = airflow_home
    job = _job(tmp_path)
    base, summary = tmp_path / "out", tmp_path / "runs.jsonl"
    conf = {"job": str(job), "output": str(base), "summary": str(summary)}
    out = base / "2026-12-01"  # the night's folder: {{ ds }} rendered by Airflow, not reaching the job as is
    watcher = _stop_first_try(out)
    proc = subprocess.run(
        [airflow, "dags", "test", "bulkinfer_nightly", "2026-12-01", "--conf", json.dumps(conf)],
        env={**env, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    watcher.join(timeout=1)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "the job was stopped (exit 75)" in log  # the first try, failed for a retry
    _every_row_once(out)
    (line,) = [json.loads(x) for x in summary.read_text().splitlines()]  # the downstream task ran once, on XCom
    assert line["output"] == str(out) and line["rows_out"] == ROWS - line["rows_already_done"]
    assert 50 <= line["rows_already_done"] < ROWS  # the retry resumed: what the first try committed was kept
    # the second night writes its own folder, every row again (not "already committed" in the first's)
    proc = subprocess.run(
        [airflow, "dags", "test", "bulkinfer_nightly", "2026-12-02", "--conf", json.dumps(conf)],
        env={**env, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    _every_row_once(base / "2026-12-02")
    second = json.loads(summary.read_text().splitlines()[1])
    assert second["output"] == str(base / "2026-12-02") and (second["rows_out"], second["rows_already_done"]) == (ROWS, 0)


def test_airflow_fails_a_bad_job_file_at_once(tmp_path, airflow_home):
    from airflow.sdk.exceptions import AirflowFailException

    from bulkinfer.airflow import BulkinferOperator

    op = BulkinferOperator(task_id="embed", job=str(tmp_path / "missing.toml"))
    assert op.retries == 3 and set(op.template_fields) == {"job", "overrides"}
    with pytest.raises(AirflowFailException, match=r"missing\.toml: config file not found"):
        op.execute({})


def test_dagster_asset_retries_a_stopped_job_and_records_the_run(tmp_path, monkeypatch):
    from dagster import DagsterInstance, materialize

    from bulkinfer.dagster import bulkinfer_asset

    job = _job(tmp_path)
    out = tmp_path / "out"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    asset = bulkinfer_asset(job=job, name="catalog_embeddings", overrides={"sink.path": str(out)})
    watcher = _stop_first_try(out)
    result = materialize([asset], instance=DagsterInstance.ephemeral())
    watcher.join(timeout=1)
    assert result.success
    _every_row_once(out)
    (event,) = result.get_asset_materialization_events()
    meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    assert meta["output"] == str(out) and meta["report"] == f"{out}/_bulkinfer/report.json"
    assert meta["rows"] == ROWS - meta["rows_already_done"] and 50 <= meta["rows_already_done"] < ROWS
    assert meta["rows_failed"] == 0 and meta["cost"] == 0.0
    retried = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retried) == 1


def test_dagster_fails_a_bad_override_at_once(tmp_path):
    from dagster import DagsterInstance, materialize

    from bulkinfer.dagster import bulkinfer_asset

    asset = bulkinfer_asset(job=_job(tmp_path), overrides={"runtime.batch_size": "many"})
    result = materialize([asset], instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    failure = result.failure_data_for_node("job")
    assert "runtime.batch_size" in failure.error.message
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


def test_the_dagster_example_defines_the_catalog_asset_over_the_demo_job():
    import runpy

    ns = runpy.run_path(str(ROOT / "examples" / "dagster" / "definitions.py"))
    (key,) = ns["defs"].resolve_asset_graph().get_all_asset_keys()
    assert key.path == ["catalog_embeddings"]
    assert ns["JOB"] == ROOT / "examples" / "catalog.toml" and ns["JOB"].exists()


def _when_committed(out: Path, then) -> threading.Thread:
    """Call ``then()`` once ``out`` has two committed shards (from a thread)."""

    def watch() -> None:
        log = out / "_bulkinfer" / "commits.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
            time.sleep(0.02)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_airflows_on_kill_stops_the_job_which_commits_and_exits_75(tmp_path, monkeypatch):
    """Airflow kills a task by calling on_kill (a marked-failed task, a timeout): the job gets
    SIGTERM, commits what is in flight and exits 75 within stop_grace_s; execute says so."""
    from airflow.exceptions import AirflowException

    from bulkinfer.airflow import BulkinferOperator

    job, out = _job(tmp_path), tmp_path / "out"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    op = BulkinferOperator(task_id="embed", job=str(job), overrides={"sink.path": str(out)}, stop_grace_s=60)
    killer = _when_committed(out, op.on_kill)
    t0 = time.monotonic()
    with pytest.raises(AirflowException, match=r"stopped \(exit 75\) with its committed rows kept"):
        op.execute({})
    killer.join(timeout=5)
    committed = read_output(out).num_rows
    assert 50 <= committed < ROWS and time.monotonic() - t0 < 60  # stopped mid-run, not run to the end


def test_a_job_that_outlives_its_grace_is_killed(tmp_path, monkeypatch):
    """stop(grace_s): SIGTERM first; a job still in a model call when the grace ends is SIGKILLed
    then, not waited for (the orchestrator's own timeout is not held up by a stuck call)."""
    from bulkinfer.orchestrate import JobProcess

    stuck = tmp_path / "STUCK"
    (tmp_path / "stuckmodel.py").write_text(textwrap.dedent(f"""
        import os, time
        import pyarrow.compute as pc

        def stuck(table):
            if os.path.exists({str(stuck)!r}):
                time.sleep(600)  # a call that does not return: the commit SIGTERM asks for never comes
            if 100 in table["x"].to_pylist():
                open({str(stuck)!r}, "w").close()
            return {{"y": pc.multiply(table["x"], 2)}}
    """))  # fmt: skip
    job = _job(tmp_path)
    job.write_text(job.read_text().replace("orchmodel:slow_double", "stuckmodel:stuck"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    process = JobProcess(job, {"sink.path": str(tmp_path / "out")})
    outcomes: list = []
    runner = threading.Thread(target=lambda: outcomes.append(process.run(lambda _line: None)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while not stuck.exists():
        assert time.monotonic() < deadline and runner.is_alive(), outcomes
        time.sleep(0.05)
    time.sleep(0.5)  # the next call is in its sleep
    t0 = time.monotonic()
    process.stop(1.0)
    runner.join(timeout=30)
    assert outcomes and outcomes[0].returncode == -signal.SIGKILL and time.monotonic() - t0 < 10
