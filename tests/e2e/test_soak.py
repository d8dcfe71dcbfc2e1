"""Soak (``pytest -m slow``): a million rows through a cheap adapter, killed at random again and
again with SIGKILL and SIGTERM until it finishes. Every row must be written exactly once with
the right value, and no run's peak memory may grow past a clean small run's."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from helpers import PEAK_LAUNCHER, read_output

ROWS = 1_000_000
CHEAP = textwrap.dedent("""
    import time
    import pyarrow.compute as pc

    def score(table):
        time.sleep(0.01)  # a model's call, so that a run lasts long enough to be killed mid-way
        return {"score": pc.add(pc.multiply(table["x1"], 2.0), table["x2"])}
""")
WRITE_INPUT = textwrap.dedent("""
    import sys
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, path = int(sys.argv[1]), sys.argv[2]
    with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("x1", pa.float64()), ("x2", pa.float64())])) as w:
        for start in range(0, n, 100_000):
            rng = np.random.default_rng(start)
            k = min(100_000, n - start)
            w.write_table(pa.table({"id": np.arange(start, start + k), "x1": rng.normal(size=k),
                                    "x2": rng.normal(size=k)}), row_group_size=10_000)
""")


def _args(inp: str, out: str) -> list[str]:
    return ["run", "-i", inp, "-m", "cheap:score", "--feature-columns", "x1,x2", "--id-column", "id", "-o", out,
            "--shard-rows", "20000", "--batch-size", "500", "--progress", "none"]  # fmt: skip


def _start(cwd: Path, report: Path, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "launch.py", str(report), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _holds(lock: Path, pid: int) -> bool:
    try:
        return json.loads(lock.read_text() or "{}").get("pid") == pid
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_a_million_rows_killed_at_random_are_written_exactly_once_in_flat_memory(tmp_path):
    (tmp_path / "cheap.py").write_text(CHEAP)
    (tmp_path / "launch.py").write_text(PEAK_LAUNCHER)  # a run killed with SIGKILL is read from /proc
    # the inputs are written by a process of their own: nothing of them lives in this one
    for n, name in ((50_000, "small.parquet"), (ROWS, "big.parquet")):
        subprocess.run([sys.executable, "-c", WRITE_INPUT, str(n), name], cwd=tmp_path, check=True)

    base = _start(tmp_path, tmp_path / "peak-base", _args("small.parquet", "base"))
    assert base.wait(timeout=300) == 0, base.communicate()
    baseline = int((tmp_path / "peak-base").read_text()) / 1024

    rng = random.Random(17)
    lock = tmp_path / "soak" / "_bulkinfer" / "lock"
    peaks: list[float] = []
    signals: list[str] = []
    for attempt in range(60):
        report = tmp_path / f"peak-{attempt}"
        proc = _start(tmp_path, report, _args("big.parquet", "soak"))
        if attempt < 40:  # then let it finish
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline and not _holds(lock, proc.pid):
                time.sleep(0.01)
            time.sleep(rng.uniform(0.1, 1.5))
        if attempt < 40 and proc.poll() is None:
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            if (peak := _hwm_mb(proc.pid)) is not None:
                peaks.append(peak)
            proc.send_signal(sig)
            _out, err = proc.communicate(timeout=120)
            signals.append(sig.name)
            if sig == signal.SIGTERM:  # stops taking work, commits what is whole, exits 75 (or 0 if it was done)
                assert proc.returncode in (75, 0), err
                if report.exists():
                    peaks.append(int(report.read_text()) / 1024)
            else:
                assert proc.returncode == -signal.SIGKILL, err
            if proc.returncode == 0:
                break
            continue
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        peaks.append(int(report.read_text()) / 1024)
        break
    else:
        pytest.fail("never finished")
    print(f"{len(signals)} kills ({', '.join(signals)}); peaks MB {[round(p) for p in peaks]}, baseline {baseline:.0f}")
    assert len(signals) >= 10 and {"SIGKILL", "SIGTERM"} <= set(signals), signals  # both deaths, many times

    out = read_output(tmp_path / "soak")
    ids = out["id"].to_numpy()
    assert len(ids) == ROWS and np.array_equal(np.sort(ids), np.arange(ROWS))  # every row once, none twice
    src = pq.read_table(tmp_path / "big.parquet").sort_by("id")
    got = out.sort_by("id")["score"].to_numpy()
    assert np.array_equal(got, src["x1"].to_numpy() * 2.0 + src["x2"].to_numpy())
    manifest = json.loads((tmp_path / "soak" / "_SUCCESS").read_text())
    assert manifest["rows"] == ROWS
    # flat: no run over 20x the rows, however far along, peaks much above the small clean run's.
    # Holding the input's three columns and the output's two whole would add 40 MB of buffers
    # alone; a resume's own work (its ledger, the parts it checks) measured +10-20 MB.
    assert 40 < baseline < 400, baseline
    assert max(peaks) < baseline + 36, (baseline, peaks)
    half = len(peaks) // 2  # and no growth as the output grows: late runs peak as early ones did
    assert max(peaks[half:]) < max(peaks[:half]) + 16, peaks
