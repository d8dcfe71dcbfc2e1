"""Faults on a real multi-node Ray cluster on this machine: a node dies, the driver dies.

The cluster (`ray.cluster_utils.Cluster`: a head with no CPUs and two 1-CPU worker nodes,
each its own raylet) lives for the module; `bulkinfer run --backend ray` joins it from a
subprocess, as it would join a real cluster.
"""

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
import pytest

from bulkinfer.commit.ledger import Ledger

from helpers import read_output, wait_commits, write

ADAPTER = textwrap.dedent("""
    import time
    import pyarrow.compute as pc

    def slow_double(table):
        time.sleep(0.01 * table.num_rows)
        return {"y": pc.multiply(table["x"], 2)}
""")

ROWS = 600


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            "num_cpus": 0,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
        },
    )
    for _ in range(2):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _job(tmp_path: Path) -> list[str]:
    (tmp_path / "rayfaults.py").write_text(ADAPTER)
    t = pa.table({"id": np.arange(ROWS), "x": np.arange(ROWS)})
    write(t, tmp_path / "in.parquet", row_group_size=50)
    return [
        "-i",
        "in.parquet",
        "-m",
        "rayfaults:slow_double",
        "--feature-columns",
        "x",
        "--id-column",
        "id",
        "--shard-rows",
        "50",
        "--output",
        "out",
        "--progress",
        "log",
        "--set",
        "runtime.batch_size=10",
        "--set",
        "execution.backend='ray'",
        "--set",
        "execution.split_min_rows=0",
    ]


def _start(args: list[str], cwd: Path, address: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "bulkinfer", "run", *args, "--set", f"execution.ray_address='{address}'"]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_exactly_once(out: Path) -> None:
    table = read_output(out).sort_by("id")
    assert table["id"].to_pylist() == list(range(ROWS))  # every id, none twice
    assert table["y"].to_pylist() == [2 * i for i in range(ROWS)]
    assert json.loads((out / "_SUCCESS").read_text())["rows"] == ROWS
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staged file left behind


def test_node_dies_mid_job_its_shard_is_requeued(tmp_path, cluster):
    proc = _start(_job(tmp_path), tmp_path, cluster.address)
    wait_commits(tmp_path / "out", 1, proc)
    victim = next(n for n in cluster.worker_nodes)
    cluster.remove_node(victim, allow_graceful=False)
    try:
        _, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        _assert_exactly_once(tmp_path / "out")
        report = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())
        assert report["backend"]["workers_lost"] == 1
        # the lost worker held at most one shard (none if it died between two): that one comes back
        # (the re-queue itself is driven deterministically by test_ray_backend's stalled worker)
        assert report["backend"]["requeued"] <= 1
        assert ("re-queued" in stderr) == (report["backend"]["requeued"] == 1)
    finally:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()


def test_every_worker_node_gone_stops_with_one_line_instead_of_hanging(tmp_path, cluster):
    """No node left that fits a worker (a replacement would wait forever): after
    worker_timeout_s the driver stops with one line; what was committed stays, and a
    rerun once nodes are back finishes exactly once."""
    args = [*_job(tmp_path), "--set", "execution.worker_timeout_s=3"]
    proc = _start(args, tmp_path, cluster.address)
    wait_commits(tmp_path / "out", 1, proc)
    try:
        for node in list(cluster.worker_nodes):
            cluster.remove_node(node, allow_graceful=False)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, stderr
        (line,) = [x for x in stderr.splitlines() if x.startswith("bulkinfer: error:")]
        assert line == (
            "bulkinfer: error: every Ray worker is gone and no node of the cluster fits a new one (largest node: "
            "0 CPUs, 0 GPUs; waited execution.worker_timeout_s=3 s for one to join); rerun when the cluster has "
            "room (committed shards are kept)"
        )
        committed = (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text().count("\n")
        assert committed >= 1
    finally:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    _rerun_resumes_exactly_once(args, tmp_path, cluster, committed)


def _rerun_resumes_exactly_once(args: list[str], tmp_path: Path, cluster, committed: int) -> dict:
    rerun = _start(args, tmp_path, cluster.address)
    _, stderr = rerun.communicate(timeout=180)
    assert rerun.returncode == 0, stderr
    _assert_exactly_once(tmp_path / "out")
    report = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())
    assert report["rows_already_done"] == committed * 50
    return report


def test_driver_killed_mid_job_rerun_resumes_exactly_once(tmp_path, cluster):
    args = _job(tmp_path)
    proc = _start(args, tmp_path, cluster.address)
    wait_commits(tmp_path / "out", 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text().count("\n")
    assert 2 <= committed < ROWS // 50
    report = _rerun_resumes_exactly_once(args, tmp_path, cluster, committed)
    assert report["rows_in"] == ROWS - committed * 50


def test_sigterm_commits_what_workers_read_then_exits_75(tmp_path, cluster):
    small_windows = ["--set", "runtime.sort_window=10", "--set", "runtime.prefetch_batches=1"]
    args = [*_job(tmp_path), "--shard-rows", "150", *small_windows]
    proc = _start(args, tmp_path, cluster.address)
    wait_commits(tmp_path / "out", 1, proc)
    time.sleep(0.75)  # the freed worker is halfway into its next shard (150 rows x 10 ms)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stderr
    commits = Ledger(tmp_path / "out").commits()
    assert any(c.stop % 150 for c in commits)  # the shards in flight were cut where their workers had read
    rerun = _start(args, tmp_path, cluster.address)
    _, stderr = rerun.communicate(timeout=180)
    assert rerun.returncode == 0, stderr
    _assert_exactly_once(tmp_path / "out")
