"""Planning at scale: how long bulkinfer takes to plan a job over many input files.

- FILES small local Parquet files (10 rows each, default 10,000): ``make_plan`` (list,
  fingerprint, footers, heads, shards), with bulkinfer's 16 planning threads and with 1.
- the same plan again as a resume (``job.json`` holds it): no footer or head is read.
- the FILES small files on an S3 API server (moto, local, in its own process), through s3fs.
- the least any planner must do for those S3 files (plain boto3: the listing and one ranged
  GET of each footer, 16 threads), so the S3 figure is read against the server's own speed.
- one big file of BIG_GB (default 2): Parquet (planned from its footer: the time must not
  grow with the data) and JSONL and CSV (line formats: every record is found and numbered,
  so the planner scans the bytes; the figure is its rate in GB/s beside the rate of
  reading the file and nothing else).
Each line gives the planner's own peak memory growth (ru_maxrss) beside the time.
Targets (issues 16/17): 10,000 files under 10 s, local and on S3; a 2,000-file Delta table
under 2 s, on 2 cores; a big Parquet file planned in the time of a small one.

Usage: .venv/bin/python bench/bench_planning.py [FILES] [DELTA_FILES] [BIG_GB]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from machine import describe  # noqa: E402


def plan_time(overrides: dict[str, object], model: Path, existing: Any = None) -> tuple[float, Any]:
    """Seconds ``make_plan`` took, and the plan (``existing``: the plan a resume finds in job.json)."""
    from bulkinfer import load_config
    from bulkinfer.adapters import build_adapter, resolve_model
    from bulkinfer.plan import make_plan

    cfg = load_config(overrides={**overrides, "model.name": str(model), "source.id_column": "id", "sink.path": "x"})
    resolved = resolve_model(cfg)
    adapter = build_adapter(cfg, resolved)
    t0 = time.perf_counter()
    plan = make_plan(cfg, resolved, adapter, existing)
    return time.perf_counter() - t0, plan


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def line(what: str, seconds: float, plan: Any, grew: float, target: str = "") -> None:
    rows = sum(s.stop - s.start for s in plan.shards)
    print(f"{what}: planned in {seconds:.2f} s, {len(plan.shards)} shards, {rows:,} rows, peak memory +{grew:.0f} MB"
          + (f" ({target})" if target else ""))  # fmt: skip


def small_files(n: int, model: Path, work: Path) -> None:
    """n 10-row Parquet files on local disk, then the same on the S3 server."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from services import S3Server

    from helpers import tabular_table

    (work / "many").mkdir()
    for i in range(n):
        pq.write_table(tabular_table(10, seed=i, start=10 * i), work / "many" / f"f{i:05d}.parquet")
    many = {"source.paths": [str(work / "many")]}
    plan_time({"source.paths": [str(work / "many" / "f00000.parquet")]}, model)  # imports, first use
    m0 = peak_mb()
    t1, plan = plan_time(many, model)
    line(f"{n} local Parquet files", t1, plan, peak_mb() - m0, "target < 10 s")
    m0 = peak_mb()
    t2, again = plan_time(many, model, existing=plan)
    assert again.shards == plan.shards
    line(f"{n} local Parquet files, resumed (job.json's plan)", t2, again, peak_mb() - m0)

    server = S3Server()
    try:
        client = server.client()
        bucket = server.bucket("bench")

        def put(i: int) -> None:
            client.put_object(Bucket=bucket, Key=f"many/f{i:05d}.parquet",
                              Body=(work / "many" / f"f{i:05d}.parquet").read_bytes())  # fmt: skip

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(n)))
        floor = least_reads(client, bucket, "many/")
        print(f"{n} Parquet files on S3, the least any planner does (boto3: list, one ranged GET of each "
              f"file's footer, 16 threads): {floor:.2f} s")  # fmt: skip
        os.environ.update(server.env)  # how a reader of s3:// finds its endpoint and credentials
        on_s3 = {"source.paths": [f"s3://{bucket}/many/"]}
        m0 = peak_mb()
        t3, plan = plan_time(on_s3, model)
        line(f"{n} Parquet files on S3 (moto server, s3fs)", t3, plan, peak_mb() - m0,
             f"{t3 / floor:.2f}x the least; target < 10 s")  # fmt: skip
        t4, again = plan_time(on_s3, model, existing=plan)
        line(f"{n} Parquet files on S3, resumed", t4, again, 0.0, "the listing alone: the ETags are the ones planned")
    finally:
        server.kill()


def least_reads(client: Any, bucket: str, prefix: str) -> float:
    """Seconds to list ``prefix`` and read each object's last 64 KiB (a Parquet footer) with
    plain boto3 on 16 threads: what planning those files cannot do without."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]

    def tail(item: tuple[str, int]) -> int:
        key, size = item
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={max(0, size - 65536)}-{size - 1}")["Body"]
        return len(body.read())

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(tail, objects))
    return time.perf_counter() - t0


def read_rate(path: Path) -> float:
    """GB/s of reading ``path`` in 16 MiB chunks and nothing else (the ceiling of a scan)."""
    t0 = time.perf_counter()
    with path.open("rb", buffering=0) as fh:
        while fh.read(1 << 24):
            pass
    return path.stat().st_size / 1e9 / (time.perf_counter() - t0)


def big_files(gb: float, model: Path, work: Path) -> None:
    """One file of about ``gb`` GB in each of Parquet, JSONL and CSV: a 1M-row block repeated."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from helpers import tabular_table

    block = tabular_table(1_000_000, seed=2)
    small = work / "small.parquet"
    pq.write_table(block.slice(0, 1000), small)
    t0, plan = plan_time({"source.paths": [str(small)]}, model)
    line("one small Parquet file (1,000 rows)", t0, plan, 0.0)

    big = work / "big.parquet"
    with pq.ParquetWriter(big, block.schema, compression="none", use_dictionary=False) as w:
        for _ in range(max(1, round(gb * 1e9 / block.nbytes))):  # uncompressed: about nbytes a block
            w.write_table(block, row_group_size=250_000)
    size = big.stat().st_size / 1e9
    m0 = peak_mb()
    t1, plan = plan_time({"source.paths": [str(big)]}, model)
    groups = pq.ParquetFile(big).metadata.num_row_groups
    line(f"one {size:.1f} GB Parquet file ({groups} row groups)", t1, plan, peak_mb() - m0,
         f"the footer only: {1000 * t1:.0f} ms against {1000 * t0:.0f} ms for the small file")  # fmt: skip

    sink = pa.BufferOutputStream()
    pacsv.write_csv(block, sink)
    csv_block = sink.getvalue().to_pybytes()
    header, body = csv_block.split(b"\n", 1)
    lines = [json.dumps(r).encode() for r in block.slice(0, 100_000).to_pylist()]
    json_block = b"\n".join(lines) + b"\n"
    for fmt, head, data in (("jsonl", b"", json_block), ("csv", header + b"\n", body)):
        path = work / f"big.{fmt}"
        with path.open("wb") as fh:
            fh.write(head)
            while fh.tell() < gb * 1e9:
                fh.write(data)
        size = path.stat().st_size / 1e9
        ceiling = read_rate(path)
        m0 = peak_mb()
        t, plan = plan_time({"source.paths": [str(path)]}, model)
        line(f"one {size:.1f} GB {fmt.upper()} file", t, plan, peak_mb() - m0,
             f"scanned at {size / t:.2f} GB/s; reading it alone: {ceiling:.2f} GB/s")  # fmt: skip
        path.unlink()


def main() -> None:
    from deltalake import write_deltalake

    from helpers import tabular_table, train_classifier

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    n_delta = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    gb = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-planning-"))
    try:
        model = train_classifier(work / "m.joblib")
        small_files(n, model, work)
        table = str(work / "delta")
        import numpy as np

        rows = tabular_table(10 * n_delta, seed=1)
        rows = rows.append_column("p", [np.arange(rows.num_rows) % n_delta])
        write_deltalake(table, rows, partition_by=["p"])  # one data file per partition, one commit
        m0 = peak_mb()
        td, plan = plan_time({"source.paths": [table], "source.format": "delta"}, model)
        line(f"Delta table of {n_delta} data files", td, plan, peak_mb() - m0, "target < 2 s")
        big_files(gb, model, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
