"""The bare-engine limit of bulkinfer's default text engine: pre-tokenized, length-sorted
batches straight into the adapter's predict, no reading, no writing, no queues.

Usage: .venv/bin/python bench/limit_engine.py IN.parquet [BATCH] [ENGINE] [PRECISION]
"""

from __future__ import annotations

import sys
import time

import pyarrow.parquet as pq

from bulkinfer import load_config
from bulkinfer.adapters import SetupContext, build_adapter, resolve_model
from bulkinfer.core.batching import plan_batches


def main() -> None:
    src = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    engine = sys.argv[3] if len(sys.argv) > 3 else "auto"
    precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
    cfg = load_config(
        overrides={
            "model.name": "minilm",
            "model.text_column": "description",
            "runtime.engine": engine,
            "runtime.precision": precision,
        }
    )
    adapter = build_adapter(cfg, resolve_model(cfg))
    adapter.setup(SetupContext())
    table = pq.read_table(src, columns=["description"])
    features = adapter.preprocess(table)
    batches = [adapter.select(features, idx) for idx in plan_batches(adapter.cost(features), table.num_rows, batch)]
    adapter.predict(batches[0])  # warm-up
    t0 = time.perf_counter()
    for b in batches:
        adapter.predict(b)
    elapsed = time.perf_counter() - t0
    print(f"rows={table.num_rows} forward_s={elapsed:.2f} rows_per_s={table.num_rows / elapsed:.1f}")


if __name__ == "__main__":
    main()
