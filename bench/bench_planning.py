"""Planning at scale: how long bulkinfer takes to plan a job over many input files.

Usage: .venv/bin/python bench/bench_planning.py [FILES] [DELTA_FILES]

- FILES small local Parquet files (10 rows each, default 10,000): ``make_plan`` (list,
  fingerprint, footers, heads, shards), with bulkinfer's 16 planning threads and with 1.
- a Delta table of DELTA_FILES data files (default 2,000): the same, through the table's log.
Targets (issue 16/17): 10,000 files under 10 s, a 2,000-file Delta table under 2 s, on 2 cores.
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


def plan_time(overrides: dict[str, object], model: Path) -> tuple[float, int]:
    from bulkinfer import load_config
    from bulkinfer.adapters import build_adapter, resolve_model
    from bulkinfer.plan import make_plan

    cfg = load_config(overrides={**overrides, "model.name": str(model), "source.id_column": "id", "sink.path": "x"})
    resolved = resolve_model(cfg)
    adapter = build_adapter(cfg, resolved)
    t0 = time.perf_counter()
    plan = make_plan(cfg, resolved, adapter, None)
    return time.perf_counter() - t0, len(plan.shards)


def main() -> None:
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from helpers import tabular_table, train_classifier

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    n_delta = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-planning-"))
    try:
        model = train_classifier(work / "m.joblib")
        (work / "many").mkdir()
        for i in range(n):
            pq.write_table(tabular_table(10, seed=i, start=10 * i), work / "many" / f"f{i:05d}.parquet")
        many = {"source.paths": [str(work / "many")]}
        plan_time({"source.paths": [str(work / "many" / "f00000.parquet")]}, model)  # imports, first use
        t1, shards = plan_time(many, model)
        print(f"{n} local Parquet files: planned in {t1:.2f} s, {shards} shards (target < 10 s)")
        table = str(work / "delta")
        import numpy as np

        rows = tabular_table(10 * n_delta, seed=1)
        rows = rows.append_column("p", [np.arange(rows.num_rows) % n_delta])
        write_deltalake(table, rows, partition_by=["p"])  # one data file per partition, one commit
        td, shards = plan_time({"source.paths": [table], "source.format": "delta"}, model)
        print(f"Delta table of {n_delta} data files: planned in {td:.2f} s, {shards} shards (target < 2 s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
