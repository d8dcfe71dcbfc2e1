"""A table through a Batch API (model.kind = "remote-batch") against the same requests handed to
the API directly, one run, on bulkinfer's own batch server (`bulkinfer serve --batches`).

Usage: .venv/bin/python bench/bench_remote_batch.py [--rows N] [--rounds N]

Per round:

- **direct**: the requests as one Batch file, uploaded and polled with the `openai` client (what a
  hand-written script does, without resume or joining the answers back);
- **remote-batch**: `bulkinfer run` over the Parquet table with `model.kind = "remote-batch"`. It
  builds the requests, uploads, creates, polls, downloads, joins the answers to the rows and
  commits Parquet parts.

Both poll every 0.2 s. Printed: requests/s end to end for each, their ratio, and the client's
overhead per 10,000 requests, as CPU seconds of the `bulkinfer run` process (its model runs on
the server) and as wall seconds over the direct path.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))

from bench_batch_service import bulkinfer_cmd  # noqa: E402
from bench_serve import free_port, start  # noqa: E402

from make_catalog import make_catalog  # noqa: E402


def direct(c: OpenAI, table_path: Path, work: Path) -> float:
    """Seconds for the same requests as one Batch file, by hand: upload, create, poll, download."""
    rows = pq.read_table(table_path).to_pylist()
    src = work / "direct.jsonl"
    with open(src, "w") as fh:
        for r in rows:
            body = {"model": "minilm", "input": r["description"]}
            fh.write(json.dumps({"custom_id": str(r["id"]), "method": "POST", "url": "/v1/embeddings", "body": body}))
            fh.write("\n")
    t0 = time.perf_counter()
    f = c.files.create(file=src.open("rb"), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    while (b := c.batches.retrieve(b.id)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.2)
    lines = c.files.content(b.output_file_id).text.splitlines()
    assert len(lines) == len(rows), (b.status, len(lines))
    return time.perf_counter() - t0


def remote(base: str, table_path: Path, out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `bulkinfer run` with the remote-batch model over the table."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [*bulkinfer_cmd(), "run", "-i", str(table_path), "-o", str(out), "-m", "minilm", "--text-column",
         "description", "--id-column", "id", "--progress", "none", "-q",
         "--set", "model.kind='remote-batch'", "--set", f"model.base_url='{base}/v1'",
         "--set", "model.endpoint='/v1/embeddings'", "--set", "model.poll_s=0.2"],
        check=True, env={**os.environ, "OPENAI_API_KEY": "unused", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from machine import describe

    print(describe())
    arg = lambda name, default: int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default  # noqa: E731
    n, rounds = arg("--rows", 4000), arg("--rounds", 3)
    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    table = work / "catalog.parquet"
    pq.write_table(make_catalog(n, seed=3), table)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start([*bulkinfer_cmd(), "serve", "-m", "minilm", "--port", str(port), "--batches", str(work / "state"),
                  "-q"], base + "/healthz")  # fmt: skip
    directs, remotes, cpus = [], [], []
    try:
        while httpx.get(base + "/readyz").status_code != 200:
            time.sleep(0.2)
        c = OpenAI(base_url=base + "/v1", api_key="unused")
        for r in range(rounds):
            directs.append(direct(c, table, work))
            wall, cpu_s = remote(base, table, work / f"out{r}")
            remotes.append(wall)
            cpus.append(cpu_s)
            print(f"round {r + 1}: direct {n / directs[-1]:.0f} req/s, remote-batch job {n / wall:.0f} req/s "
                  f"(client CPU {cpu_s:.2f} s)", flush=True)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    d, w, cpu_s = statistics.median(directs), statistics.median(remotes), statistics.median(cpus)
    print(f"\nmedian of {rounds} rounds, {n} requests")
    print(f"direct Batch file: {n / d:.0f} req/s; remote-batch job: {n / w:.0f} req/s = {d / w:.2f}x")
    print(f"client overhead per 10,000 requests: {cpu_s / n * 1e4:.2f} CPU s of the bulkinfer process "
          f"(start-up included), {(w - d) / n * 1e4:.2f} s of wall time over the direct path")  # fmt: skip


if __name__ == "__main__":
    main()
