"""Peak memory must not grow with the input: 10x more rows, about the same peak RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from helpers import PEAK_LAUNCHER, tabular_table, write

CHEAP = textwrap.dedent("""
    import pyarrow.compute as pc

    def score(table):
        return {"score": pc.add(pc.multiply(table["x1"], 2.0), table["x2"])}
""")


def _peak_rss_mb(cwd, args) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    (cwd / "launch.py").write_text(PEAK_LAUNCHER)
    report = cwd / f"peak-{len(list(cwd.glob('peak-*')))}.txt"
    proc = subprocess.run(
        [sys.executable, "launch.py", str(report), "run", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return int(report.read_text()) / 1024


def test_peak_memory_is_flat_in_input_size(tmp_path):
    (tmp_path / "cheap.py").write_text(CHEAP)
    for n in (20_000, 400_000):
        write(tabular_table(n), tmp_path / f"in{n}" / "data.parquet", row_group_size=5_000)
    big = tabular_table(2_000_000)  # this process may hold a lot: the runs' peaks must not see it
    assert big.num_rows == 2_000_000
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
    assert 40 < peaks[20_000] < 400, peaks  # a real measurement of a Python process with pyarrow, not 0 or the parent
    assert peaks[400_000] < peaks[20_000] + 8, peaks
