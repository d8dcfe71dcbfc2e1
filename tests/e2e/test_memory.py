"""Peak memory must not grow with the input: 10x more rows, about the same peak RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from helpers import tabular_table, write

CHEAP = textwrap.dedent("""
    import pyarrow.compute as pc

    def score(table):
        return {"score": pc.add(pc.multiply(table["x1"], 2.0), table["x2"])}
""")


def _peak_rss_mb(cwd, args) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bulkinfer", "run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read() if proc.stderr else ""
    return usage.ru_maxrss / 1024


def test_peak_memory_is_flat_in_input_size(tmp_path):
    (tmp_path / "cheap.py").write_text(CHEAP)
    for n in (20_000, 400_000):
        write(tabular_table(n), tmp_path / f"in{n}" / "data.parquet", row_group_size=5_000)
    peaks = {}
    for n in (20_000, 400_000):
        peaks[n] = _peak_rss_mb(
            tmp_path,
            [
                "-i",
                f"in{n}",
                "-m",
                "cheap:score",
                "--feature-columns",
                "x1,x2",
                "--id-column",
                "id",
                "--keep-columns",
                "segment",
                "-o",
                f"out{n}",
                "--shard-rows",
                "5000",
                "--batch-size",
                "1024",
                "--progress",
                "none",
            ],
        )
    assert (tmp_path / "out400000" / "_SUCCESS").exists()
    # held whole, the 400k-row input and its outputs would add ~30 MB over the 20k one; allow only a few MB of drift
    assert peaks[400_000] < peaks[20_000] + 8, peaks
