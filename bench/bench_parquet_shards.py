"""Shards inside large Parquet row groups: a run over one file is as fast whatever the file's
row-group size (one group, pyarrow's default of 1,048,576 rows, 20,000-row groups), and tiny
shards scale linearly (growth exponent k from n and 2n shards). The anchor: pyarrow reading
the whole file and the same model over it in one call, same run.

    python bench/bench_parquet_shards.py [ROWS] [--tiny SHARDS]

The same run also reads the one-group file with every shard decoding its group from the start
(the reader before: ``PLACES_KEPT = 0``), for the ratio.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MODEL = """
import numpy as np


def score(table):
    return {"score": np.asarray(table["x"].to_numpy(zero_copy_only=False), dtype=np.float64) * 2.0}
"""


def flags() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    have = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return " ".join(sorted(f for f in have if f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")))


def write(path: Path, rows: int, group: int | None) -> None:
    table = pa.table({"id": np.arange(rows), "x": np.random.default_rng(0).random(rows)})
    pq.write_table(table, path, row_group_size=group)  # None: pyarrow's default


def run(work: Path, inp: Path, out: str, shard_rows: int) -> float:
    from bulkinfer import load_config, run_job

    cfg = load_config(overrides={
        "source.paths": [str(inp)], "source.id_column": "id", "model.name": "benchmodel:score",
        "model.feature_columns": ["x"], "sink.path": str(work / out), "source.shard_rows": shard_rows,
        "execution.progress": "none", "runtime.batch_size": 4096,
    })  # fmt: skip
    t0 = time.perf_counter()
    result = run_job(cfg)
    took = time.perf_counter() - t0
    assert result.report["rows_out"] == pq.ParquetFile(inp).metadata.num_rows
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=int, nargs="?", default=2_000_000)
    ap.add_argument("--tiny", type=int, default=5_000, help="two-row shards in the growth test (and twice that)")
    args = ap.parse_args()
    print(f"cpu flags: {flags()}; {args.rows} rows, source.shard_rows 10000")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "benchmodel.py").write_text(MODEL)
        sys.path.insert(0, str(work))
        t0 = time.perf_counter()
        write(work / "anchor.parquet", args.rows, 20_000)
        table = pq.read_table(work / "anchor.parquet")
        np.asarray(table["x"].to_numpy(), dtype=np.float64) * 2.0
        print(f"anchor (write + pyarrow read + model, one call): {time.perf_counter() - t0:.2f} s")
        times = {}
        for name, group in (("one group", args.rows), ("pyarrow default", None), ("20,000-row groups", 20_000)):
            write(work / f"{name[:3]}.parquet", args.rows, group)
            times[name] = run(work, work / f"{name[:3]}.parquet", f"out-{name[:3]}", 10_000)
            print(f"{name:>18}: {times[name]:6.2f} s  ({times[name] / times['one group']:.2f}x one group's time)")
        print(f"one group / 20,000-row groups: {times['one group'] / times['20,000-row groups']:.2f}x")
        from bulkinfer.sources import parquet

        kept, parquet.PLACES_KEPT = parquet.PLACES_KEPT, 0  # every shard decodes its group from the start
        before = run(work, work / "one.parquet", "out-one-before", 10_000)
        parquet.PLACES_KEPT = kept
        print(
            f"one group, each shard decoding its group from the start (before): {before:6.2f} s "
            f"= {before / times['one group']:.1f}x the time of reading on"
        )
        for name, group in (("one group", None), ("1,000-row groups", 1_000)):
            spans = []
            for n in (args.tiny, 2 * args.tiny):
                path = work / f"tiny-{n}-{group}.parquet"
                write(path, 2 * n, group or 2 * n)
                spans.append((n, run(work, path, f"tiny-{n}-{group}", 2)))
            (n1, t1), (n2, t2) = spans
            k = math.log(t2 / t1) / math.log(n2 / n1)
            print(f"two-row shards, {name:>16}: {n2 / t2:7.0f} shards/s at {n2} shards; growth k = {k:.2f}")


if __name__ == "__main__":
    main()
