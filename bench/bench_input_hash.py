"""What writing each row's input hash costs (``sink.input_hash``: what ``--incremental-from`` needs of
the previous output), one run, same data, hashes off vs on, rounds alternating: the figures behind
turning them on by default for outputs with ids (#37 item 9).

Usage: .venv/bin/python bench/bench_input_hash.py [ROWS] [--rounds N] [--text-rows M]

Three jobs, each run with ``sink.input_hash = false`` and ``true``:

- LightGBM (100 trees) over ROWS (default 1M) rows of 6 float features (bench_tabular's data):
  numbers hash vectorised;
- an instant model (bench/instant.py: the output is its input) over ROWS rows of a text column:
  the worst case, every row's text through BLAKE2b and no model time to hide it;
- the bundled text model over M (default 2000) catalog rows: the common case.

Prints rows/s (the run, after set-up) and the output's bytes for each, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "input_hash"
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "examples")]

from bench_tabular import make_data  # noqa: E402
from machine import describe  # noqa: E402


def run(args: list[str], out: Path, hashes: bool) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "bench")}
    cmd = [sys.executable, "-m", "bulkinfer", "run", *args, "-o", str(out), "--progress", "none",
           "--set", f"sink.input_hash={'true' if hashes else 'false'}"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    report = json.loads((out / "_bulkinfer" / "report.json").read_text())
    size = sum(p.stat().st_size for p in out.glob("part-*"))
    return report["rows_per_s"], size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=int, nargs="?", default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--text-rows", type=int, default=2000)
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    print(describe(), flush=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from make_catalog import make_catalog

    data, model = make_data(a.rows)
    texts = WORK / f"texts_{a.rows}.parquet"
    if not texts.exists():
        words = pq.read_table(data, columns=["id"]).column("id").to_numpy()
        pq.write_table(pa.table({"id": words, "text": [f"item {i} blue cotton shirt size {i % 7}" for i in words]}),
                       texts, row_group_size=100_000)  # fmt: skip
    catalog = WORK / f"catalog_{a.text_rows}.parquet"
    if not catalog.exists():
        pq.write_table(make_catalog(a.text_rows, seed=1), catalog)
    jobs = {
        f"LightGBM, {a.rows} rows x 6 floats": ["-i", str(data), "-m", str(model), "--id-column", "id",
                                                 "--feature-columns", "x1,x2,x3,x4,x5,x6"],
        f"instant model, {a.rows} rows of text": ["-i", str(texts), "-m", "instant:Instant", "--id-column", "id",
                                                  "--feature-columns", "text"],
        f"bundled text model, {a.text_rows} rows": ["-i", str(catalog), "-m", "minilm", "--id-column", "id",
                                                    "--text-column", "description"],
    }  # fmt: skip
    for name, args in jobs.items():
        seen: dict[bool, list[float]] = {False: [], True: []}
        size: dict[bool, int] = {}
        for _ in range(a.rounds):
            for hashes in (False, True):
                rps, size[hashes] = run(args, WORK / "out", hashes)
                seen[hashes].append(rps)
        off, on = statistics.median(seen[False]), statistics.median(seen[True])
        print(
            f"{name}: off {off:,.0f} rows/s, on {on:,.0f} rows/s ({on / off:.3f}x); output "
            f"{size[False] / 1e6:.1f} MB -> {size[True] / 1e6:.1f} MB ({size[True] / size[False]:.3f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()
