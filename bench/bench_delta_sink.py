"""Delta sink overhead: the same job written as Parquet parts and as a Delta table (one
idempotent Delta commit per part), one run.

Usage: .venv/bin/python bench/bench_delta_sink.py [ROWS] [SHARD_ROWS]

A cheap scikit-learn model over ROWS (default 400,000) generated rows, so that writing is a
large share of the run: the time the Delta table costs over plain Parquet parts (target:
<= 10%), best of 3 runs each, and a check that both outputs hold the same rows.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from machine import describe  # noqa: E402


def main() -> None:
    from deltalake import DeltaTable

    from bulkinfer import load_config, run_job

    from helpers import read_output, tabular_table, train_classifier, write

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400_000
    shard = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        write(tabular_table(n, seed=5), work / "in.parquet")
        model = train_classifier(work / "model.joblib")
        base = {"source.paths": [str(work / "in.parquet")], "model.name": str(model), "source.id_column": "id",
                "model.feature_columns": ["x1", "x2", "x3"], "source.shard_rows": shard,
                "sink.keep_columns": ["x1", "x2", "x3", "segment"], "execution.progress": "none"}  # fmt: skip
        best: dict[str, float] = {}
        for attempt in range(3):
            for fmt in ("parquet", "delta"):
                out = work / f"{fmt}-{attempt}"
                t0 = time.perf_counter()
                run_job(load_config(overrides={**base, "sink.path": str(out), "sink.format": fmt}))
                best[fmt] = min(best.get(fmt, float("inf")), time.perf_counter() - t0)
        files = read_output(work / "parquet-0").sort_by("id")
        table = DeltaTable(str(work / "delta-0")).to_pyarrow_table().sort_by("id")
        assert table.equals(files), "the Delta table differs from the Parquet parts"
        print(f"{n} rows, {n // shard} parts: parquet {best['parquet']:.2f} s, delta {best['delta']:.2f} s (best of 3)")
        print(f"delta overhead: {100 * (best['delta'] / best['parquet'] - 1):+.1f}% (target <= 10%)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
