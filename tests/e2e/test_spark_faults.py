"""`bulkinfer run --backend spark` as a process a scheduler runs, on its own local Spark: stopped
by SIGTERM (exit 75, shards in flight committed), then SIGKILLed mid-run (checked: shards were
left), then resumed on Spark to the end; every row is in the output exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bulkinfer.commit.ledger import Ledger

from helpers import BULKINFER, read_output, wait_commits, write

MODEL = textwrap.dedent("""
    import time
    import pyarrow.compute as pc

    def slow_double(table):
        time.sleep(0.01 * table.num_rows)
        return {"y": pc.multiply(table["x"], 2)}
""")

ROWS = 300
ARGS = ["-i", "in.parquet", "-m", "sparkfaults:slow_double", "--feature-columns", "x", "--id-column", "id",
        "--shard-rows", "25", "--output", "out", "--progress", "none", "--backend", "spark",
        "--set", "execution.spark_master=local[2]"]  # fmt: skip


def _start(tmp_path, *extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)}
    return subprocess.Popen([*BULKINFER, "run", *ARGS, *extra], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _children(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _stat(p)[1] == pid]


def _stat(p: str) -> tuple[str, int | None]:
    """A process's state letter and parent (``("", None)`` once it is gone)."""
    try:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "", None
    return fields[0], int(fields[1])


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _stat(str(pid))[0] in ("", "Z"):
            return True
        time.sleep(0.2)
    return False


def test_sigterm_then_sigkill_then_resume_every_row_once(tmp_path):
    (tmp_path / "sparkfaults.py").write_text(MODEL)
    write(pa.table({"id": np.arange(ROWS), "x": np.arange(ROWS)}), tmp_path / "in.parquet", row_group_size=50)
    out = tmp_path / "out"

    first = _start(tmp_path)
    wait_commits(out, 2, first)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 75, stderr
    assert "interrupted; committed rows are kept" in stderr
    after_term = Ledger(out).commits()
    stopped = json.loads((out / "_bulkinfer" / "report.json").read_text())  # a stopped run reports too
    assert stopped["backend"]["name"] == "spark" and stopped["backend"]["master"] == "local[2]"
    assert stopped["backend"]["shards"] == len(after_term) >= stopped["backend"]["tasks"]
    assert 2 <= len(after_term) < ROWS // 25

    second = _start(tmp_path)
    wait_commits(out, len(after_term) + 3, second)
    jvm = _children(second.pid)  # the Spark JVM this driver started
    second.send_signal(signal.SIGKILL)
    second.wait()
    assert jvm and all(_gone(j) for j in jvm)  # it does not outlive its driver
    after_kill = Ledger(out).commits()
    assert len(after_term) < len(after_kill) < ROWS // 25  # the kill landed mid-run: shards were left

    third = _start(tmp_path)  # resumed on Spark, as the scheduler reruns the same command
    _, stderr = third.communicate(timeout=180)
    assert third.returncode == 0, stderr
    got = read_output(out)
    assert sorted(got["id"].to_pylist()) == list(range(ROWS))  # every row once
    assert dict(zip(got["id"].to_pylist(), got["y"].to_pylist(), strict=True)) == {i: 2 * i for i in range(ROWS)}
    report = json.loads((out / "_bulkinfer" / "report.json").read_text())
    assert report["rows_already_done"] == sum(c.stop - c.start for c in after_kill)
    assert report["backend"]["name"] == "spark"  # Spark finished it
    assert report["backend"]["shards"] == ROWS // 25 - len(after_kill)  # only what the kill left
    assert not list(out.glob(".part-*"))
