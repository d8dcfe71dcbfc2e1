"""Export targets and object-store output, side by side, one run.

Usage: .venv/bin/python bench/bench_exports.py [ROWS] [--output DIR] [--job-rows N]

- Redis: bulkinfer's export (pipelined batches) vs one ``SET`` per row from a plain
  redis-py loop, over the same ROWS rows of 384-dim float32 embeddings (a finished
  output's with ``--output``, else generated in its shape, so no model is timed).
- PostgreSQL: bulkinfer's export (binary COPY in one transaction per part, pgvector) vs a
  row-by-row ``INSERT`` loop in one transaction.
- S3: the same whole job (the bundled model over N catalog rows) to a local folder and
  to a moto S3 server; the ratio is S3 time / local time.

The servers are the test suite's (tests/services.py): redis-server, PostgreSQL with
pgvector, moto, started here on free ports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from machine import describe  # noqa: E402


def rows_table(n: int, output: str | None):
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as pads

    if output:
        table = pads.dataset(output, format="parquet", exclude_invalid_files=True).to_table()
        return table.slice(0, n)
    rng = np.random.default_rng(0)
    m = rng.normal(size=(n, 384)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(m.ravel()), 384)
    return pa.table({"id": np.arange(n), "embedding": emb})


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_redis(table, work: Path) -> tuple[float, float]:
    from bulkinfer.config import RedisExport
    from bulkinfer.plan import JobPlan
    from bulkinfer.sinks.exports import vectors
    from bulkinfer.sinks.redis import RedisTarget
    from services import RedisServer

    server = RedisServer(work / "redis")
    try:
        r = server.client()
        ids, vecs = table.column("id").to_pylist(), vectors(table.column("embedding"))

        def plain() -> None:
            for i, v in zip(ids, vecs, strict=True):
                r.set(f"plain:{i}", v.tobytes())

        target = RedisTarget(RedisExport(url=server.url, key="emb:{id}", columns=["embedding"]), "export[0]")
        target.start(JobPlan.from_json({"fingerprint": "bench" * 4}), ["id"])

        def ours() -> None:
            for off in range(0, table.num_rows, 10_000):  # parts of 10k rows, as shards commit them
                target.write(f"part-{off}", table.slice(off, 10_000))

        anchor, mine = timed(plain), timed(ours)
        assert r.dbsize() == 2 * table.num_rows
        target.close()
        return anchor, mine
    finally:
        server.kill()


def bench_postgres(table, work: Path) -> tuple[float, float]:
    from bulkinfer.config import PostgresExport
    from bulkinfer.plan import JobPlan
    from bulkinfer.sinks.exports import vectors
    from bulkinfer.sinks.postgres import PostgresTarget
    from services import PostgresServer

    server = PostgresServer(work / "pg")
    try:
        ids, vecs = table.column("id").to_pylist(), vectors(table.column("embedding"))
        with server.connect() as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS vector")
            c.execute("CREATE TABLE plain (id bigint, embedding vector(384))")
        import psycopg
        from pgvector.psycopg import register_vector

        def plain() -> None:
            with psycopg.connect(server.dsn) as conn:
                register_vector(conn)
                with conn.transaction():
                    for i, v in zip(ids, vecs, strict=True):
                        conn.execute("INSERT INTO plain (id, embedding) VALUES (%s, %s)", (i, v))

        target = PostgresTarget(PostgresExport(dsn=server.dsn, table="ours", mode="append"), "export[0]")
        target.start(JobPlan.from_json({"fingerprint": "bench", "config": {"source": {"id_column": "id"}}}), ["id"])

        def ours() -> None:
            for off in range(0, table.num_rows, 10_000):
                target.write(f"part-{off}", table.slice(off, 10_000))

        anchor, mine = timed(plain), timed(ours)
        with server.connect() as c:
            assert c.execute("SELECT count(*) FROM ours").fetchone()[0] == table.num_rows
        target.close()
        return anchor, mine
    finally:
        server.stop()


def bench_s3(rows: int, work: Path) -> tuple[float, float]:
    import subprocess

    import pyarrow.parquet as pq

    from services import S3Server

    from make_catalog import make_catalog

    pq.write_table(make_catalog(rows), work / "catalog.parquet", row_group_size=500)
    server = S3Server()
    try:
        server.bucket("bench")
        env = {**os.environ, **server.env}
        base = [sys.executable, "-m", "bulkinfer", "run", "-i", str(work / "catalog.parquet"), "-m", "minilm",
                "--text-column", "description", "--id-column", "id", "--progress", "none", "--quiet",
                "--set", "source.shard_rows=500"]  # fmt: skip
        subprocess.run([*base, "-o", str(work / "warm")], check=True)  # compile the ONNX model once, outside the timing
        local = timed(lambda: subprocess.run([*base, "-o", str(work / "local")], env=env, check=True))
        s3 = timed(lambda: subprocess.run([*base, "-o", "s3://bench/out"], env=env, check=True))
        return local, s3
    finally:
        server.kill()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rows", nargs="?", type=int, default=20_000)
    p.add_argument("--output", help="a finished bulkinfer output to take the rows from")
    p.add_argument("--job-rows", type=int, default=2000)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-exports-"))
    try:
        table = rows_table(a.rows, a.output)
        print(f"{describe()}; {table.num_rows} rows x 384-dim float32")
        anchor, mine = bench_redis(table, work)
        print(f"redis   SET-per-row loop {table.num_rows / anchor:10,.0f} rows/s | bulkinfer export "
              f"{table.num_rows / mine:10,.0f} rows/s | {anchor / mine:5.1f}x")  # fmt: skip
        anchor, mine = bench_postgres(table, work)
        print(f"postgres INSERT-per-row  {table.num_rows / anchor:10,.0f} rows/s | bulkinfer export "
              f"{table.num_rows / mine:10,.0f} rows/s | {anchor / mine:5.1f}x")  # fmt: skip
        local, s3 = bench_s3(a.job_rows, work)
        print(
            f"job of {a.job_rows} rows: local folder {local:.1f} s | s3 (moto) {s3:.1f} s | s3/local {s3 / local:.2f}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
