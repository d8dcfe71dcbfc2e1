"""The batch service against its own anchors, one run: `bulkinfer run` on the same Batch file,
and `bulkinfer serve` answering online traffic with no batch running.

Usage: .venv/bin/python bench/bench_batch_service.py [--requests N] [--online N] [--rounds N]

Prints, with the CPU and its flags:

1. a batch with no online traffic: requests/s of the batch's job (its report's run phase)
   and client-visible (create to completed), against `bulkinfer run` on the same file
   (target >= 0.9x);
2. single online requests, one client, 20 ms apart: p50/p95 with the server idle and while
   a batch runs (target: p95 during <= 2x idle p95 + 50 ms);
3. 32 closed-loop online clients (../shared/bench/load_embed.py): requests/s alone and while
   a batch runs (target >= 0.8x), and the requests/s the batch still made meanwhile.

The batch file holds embeddings requests of 5 to 60 words (the texts load_embed.py sends).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bench_serve import free_port, load, load_texts, start
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]


def batch_file(path: Path, n: int) -> None:
    texts = load_texts()
    rng = random.Random(7)
    with open(path, "w") as fh:
        for i in range(n):
            body = {"model": "minilm", "input": texts[rng.randrange(len(texts))]}
            fh.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n")


def bulkinfer_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "bulkinfer"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bulkinfer"]


def run_anchor(src: Path, out: Path) -> tuple[float, float]:
    """`bulkinfer run` on the file: (requests/s of its run phase, of its whole wall time)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([*bulkinfer_cmd(), "run", "-i", str(src), "-m", "minilm", "-o", str(out), "--progress", "none",
                    "-q"], check=True, env=env)  # fmt: skip
    report = json.loads((out / "_bulkinfer" / "report.json").read_text())
    return report["rows_out"] / report["run_s"], report["rows_out"] / report["wall_s"]


def submit(c: OpenAI, src: Path) -> str:
    f = c.files.create(file=src.open("rb"), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h").id


def wait(c: OpenAI, bid: str, state: Path) -> tuple[float, float]:
    """Until ``bid`` completes: (requests/s of its job's run phase, client-visible requests/s)."""
    t0 = time.perf_counter()
    while (b := c.batches.retrieve(bid)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    report = json.loads((state / "batches" / bid / "output" / "_bulkinfer" / "report.json").read_text())
    assert b.request_counts is not None
    return report["rows_out"] / report["run_s"], b.request_counts.completed / wall


def singles(base: str, n: int) -> list[float]:
    """Latencies (ms) of ``n`` one-text requests from one client, 20 ms apart."""
    texts = load_texts()
    out = []
    with httpx.Client(timeout=60) as http:
        for i in range(n):
            t0 = time.perf_counter()
            r = http.post(base + "/v1/embeddings", json={"input": texts[i % len(texts)], "model": "minilm"})
            out.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
            time.sleep(0.02)
    return out


def p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.95))]


def progress(c: OpenAI, bid: str) -> int:
    counts = c.batches.retrieve(bid).request_counts
    return counts.completed + counts.failed if counts else 0


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    print(describe())
    arg = lambda name, default: int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default  # noqa: E731
    n, online, rounds = arg("--requests", 4000), arg("--online", 200), arg("--rounds", 2)
    work = Path(tempfile.mkdtemp(prefix="bench-batches-"))
    src, long_src = work / "batch.jsonl", work / "long.jsonl"
    batch_file(src, n)
    batch_file(long_src, 60_000 if n >= 4000 else 10 * n)
    state = work / "state"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [*bulkinfer_cmd(), "serve", "-m", "minilm", "--port", str(port), "--batches", str(state), "-q",
           "--set", "serve.max_batch_requests=100000"]  # fmt: skip
    runs, batches, idle, during, alone32, with32, batch_during32 = [], [], [], [], [], [], []
    proc = start(cmd, base + "/healthz")
    try:
        while httpx.get(base + "/readyz").status_code != 200:
            time.sleep(0.2)
        c = OpenAI(base_url=base + "/v1", api_key="x")
        singles(base, 20)  # warm
        for r in range(rounds):
            print(f"-- round {r + 1} of {rounds}", flush=True)
            runs.append(run_anchor(src, work / f"ran{r}"))
            batches.append(wait(c, submit(c, src), state))
            print(f"batch alone: job {batches[-1][0]:.0f} req/s (client {batches[-1][1]:.0f}); "
                  f"bulkinfer run: {runs[-1][0]:.0f} req/s (wall {runs[-1][1]:.0f})", flush=True)  # fmt: skip
            idle.append(singles(base, online))
            alone32.append(load(base + "/v1/embeddings", "openai", 32, 640)["rps"])
            bid = submit(c, long_src)
            while progress(c, bid) < 200:  # the batch is running
                time.sleep(0.05)
            during.append(singles(base, online))
            before, t0 = progress(c, bid), time.perf_counter()
            with32.append(load(base + "/v1/embeddings", "openai", 32, 640)["rps"])
            batch_during32.append((progress(c, bid) - before) / (time.perf_counter() - t0))
            c.batches.cancel(bid)
            while c.batches.retrieve(bid).status != "cancelled":
                time.sleep(0.1)
            print(f"online p95 idle {p95(idle[-1]):.1f} ms, during a batch {p95(during[-1]):.1f} ms; 32 clients "
                  f"{alone32[-1]:.0f} rps alone, {with32[-1]:.0f} with a batch ({batch_during32[-1]:.0f} batch "
                  "req/s meanwhile)", flush=True)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    med = statistics.median
    job, client = med(b[0] for b in batches), med(b[1] for b in batches)
    run_job, run_wall = med(r[0] for r in runs), med(r[1] for r in runs)
    idle95 = med(p95(x) for x in idle)
    during95 = med(p95(x) for x in during)
    print(f"\nmedian of {rounds} rounds, {n} requests per batch")
    print(f"batch alone: {job:.0f} req/s in its job, {client:.0f} req/s create-to-completed; bulkinfer run "
          f"{run_job:.0f} req/s in its run phase, {run_wall:.0f} with start-up")  # fmt: skip
    print(f"  batch / run = {job / run_job:.2f} (target >= 0.9); client-visible batch / run wall = "
          f"{client / run_wall:.2f}")  # fmt: skip
    print(f"online p50 idle {med(med(x) for x in idle):.1f} ms, during a batch {med(med(x) for x in during):.1f} ms")
    print(f"online p95 idle {idle95:.1f} ms, during a batch {during95:.1f} ms: limit 2 x idle + 50 = "
          f"{2 * idle95 + 50:.1f} ms -> {'met' if during95 <= 2 * idle95 + 50 else 'MISSED'}")  # fmt: skip
    a32, w32 = med(alone32), med(with32)
    print(f"32 clients: {a32:.0f} rps alone, {w32:.0f} while a batch runs = {w32 / a32:.2f} (target >= 0.8); "
          f"the batch meanwhile {med(batch_during32):.0f} req/s")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
