"""Online, side by side, one run: `bulkinfer serve` with dynamic batching on and off, and
the LitServe anchor (../shared/bench/anchor_litserve.py, max batch 32, 10 ms window).

Usage: .venv/bin/python bench/bench_serve.py [--requests N] [--repeat N] [--device cuda] [--no-litserve]

Each server is started on loopback and driven by ../shared/bench/load_embed.py (closed
loop, one text per request, bounded in count and time) at 1, 8 and 32 concurrent
clients; it prints requests/s (= rows/s), p50 and p99 latency, errors, and the ratio of
batching on to batching off at 32 clients. The load generator shares the machine's CPUs
with the server, as it would on a small box.

In the same run it measures what batching can give at most on this machine: the model
alone (no HTTP) on load_embed.py's texts, one row per call against merges of the size
the server saw at 32 clients (from its /metrics), cut by length as the server cuts them.
On a GPU that ratio is large; on a small CPU a one-row call is nearly as efficient per
token as a big one, and no server can batch past it. ``--device cuda`` serves (and measures
the model alone) on the GPU; ``--no-litserve`` leaves the anchor out where LitServe is not
installed (the GPU check, bench/gpu/check.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa

from bulkinfer.adapters import SetupContext, build_adapter, predict_table, resolve_model
from bulkinfer.config import load_config
from bulkinfer.core.hardware import available_cpus
from bulkinfer.serve.batcher import measure_call_overhead

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BULKINFER_SHARED_BENCH") or ROOT.parent / "shared" / "bench")
CLIENTS = (1, 8, 32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], ready_url: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # its own process group: LitServe forks workers that outlive a terminated parent
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(ready_url, timeout=2).status_code < 500:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"server did not start: {' '.join(cmd)}")


def load(url: str, kind: str, clients: int, total: int) -> dict[str, float]:
    per_client = max(1, total // clients)
    out = subprocess.run(
        [sys.executable, str(SHARED / "load_embed.py"), url, kind, str(clients), str(per_client)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", out)}


def load_texts() -> list[str]:
    """The 256 texts load_embed.py sends (same words, same seed, same draws)."""
    words = [
        "wireless",
        "bluetooth",
        "headphones",
        "noise",
        "cancelling",
        "steel",
        "water",
        "bottle",
        "kids",
        "toy",
        "organic",
        "cotton",
        "shoes",
    ]
    rng = random.Random(1)
    return [" ".join(rng.choices(words, k=rng.randint(5, 60))) for _ in range(256)]


def batch_rows(base: str) -> tuple[float, float]:
    """Rows run and model calls so far, from the server's /metrics."""
    text = httpx.get(base + "/metrics", timeout=10).text
    sums = dict(re.findall(r"^bulkinfer_serve_batch_rows_(sum|count) ([\d.e+]+)$", text, re.M))
    return float(sums["sum"]), float(sums["count"])


def model_ceiling(merge: int, device: str, rounds: int = 3) -> tuple[float, float]:
    """rows/s of the model alone (the server's engine and threads, no HTTP): one row per
    call, and ``merge`` rows per merge cut by length as the server cuts them; best of rounds."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = load_config(None, {"model.name": "minilm", "model.text_column": "text", "runtime.device": device}, [])
    model = resolve_model(cfg)
    adapter = build_adapter(cfg, model)
    adapter.setup(SetupContext(threads=cfg.runtime.threads or available_cpus(), device=device, online=True))
    overhead = measure_call_overhead(adapter, pa.table({"text": ["a short text of some words"] * 16}))
    tables = {n: [pa.table({"text": chunk}) for chunk in np.array_split(np.array(load_texts()), 256 // n)]
              for n in (1, merge)}  # fmt: skip
    best = {1: 0.0, merge: 0.0}
    for _ in range(rounds):
        for n, chunks in tables.items():
            t0 = time.perf_counter()
            for chunk in chunks:
                predict_table(adapter, chunk, cfg.runtime.rows_per_call, overhead)
            best[n] = max(best[n], 256 / (time.perf_counter() - t0))
    return best[1], best[merge]


def measure(name: str, setup: tuple, total: int) -> tuple[dict[int, dict[str, float]], float]:
    """One server at 1, 8 and 32 clients; and, for bulkinfer, its mean rows per model call at 32."""
    cmd, route, kind, ready = setup
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(cmd(port), base + ready)
    out, merge = {}, 1.0
    try:
        while httpx.get(base + ready, timeout=2).status_code != 200:  # bulkinfer: model loaded
            time.sleep(0.5)
        load(base + route, kind, 4, 16)  # warm-up
        for c in CLIENTS:
            before = batch_rows(base) if kind == "openai" else (0.0, 0.0)
            out[c] = r = load(base + route, kind, c, total)
            print(
                f"{name:26s} clients={c:2d} rps={r['rps']:6.1f} p50={r['p50_ms']:5.0f} ms "
                f"p99={r['p99_ms']:5.0f} ms errors={int(r['errors'])}",
                flush=True,
            )
            if kind == "openai" and c == CLIENTS[-1]:
                rows, calls = (after - prior for after, prior in zip(batch_rows(base), before, strict=True))
                merge = rows / max(1.0, calls)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return out, merge


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    print(describe())  # the CPU and its fast-path flags, beside every figure
    total = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 640
    rounds = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    exe = Path(sys.executable).parent / "bulkinfer"
    serve = [str(exe)] if exe.exists() else [sys.executable, "-m", "bulkinfer"]  # the GPU machine: no entry point
    serve += ["serve", "-m", "minilm", "--text-column", "text", "-q", "--set", f"runtime.device={device}"]
    if device.startswith("cuda"):
        serve += ["--set", "runtime.engine=torch"]
    unbatched = ["--set", "serve.max_batch_size=1", "--set", "serve.max_wait_ms=0"]
    setups = {
        "bulkinfer, batching on": (
            lambda port: [*serve, "--port", str(port)], "/v1/embeddings", "openai", "/readyz",
        ),
        "bulkinfer, batching off": (
            lambda port: [*serve, "--port", str(port), *unbatched],
            "/v1/embeddings", "openai", "/readyz",
        ),
        "LitServe anchor": (
            lambda port: [sys.executable, str(SHARED / "anchor_litserve.py"), str(port), "32", "0.01"],
            "/predict", "litserve", "/health",
        ),
    }  # fmt: skip
    if "--no-litserve" in sys.argv:
        del setups["LitServe anchor"]
    # rounds rotate the order: on this machine whichever server runs first is measured slower
    runs: dict[str, list[dict[int, dict[str, float]]]] = {name: [] for name in setups}
    merges = []
    names = list(setups)
    for i in range(rounds):
        print(f"-- round {i + 1} of {rounds}", flush=True)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            out, merge = measure(name, setups[name], total)
            runs[name].append(out)
            if name == "bulkinfer, batching on":
                merges.append(merge)
    print(f"\nmedian of {rounds} rounds")
    med: dict[str, dict[int, dict[str, float]]] = {}
    for name, outs in runs.items():
        med[name] = {c: {k: statistics.median(o[c][k] for o in outs) for k in outs[0][c]} for c in CLIENTS}
        cells = "  ".join(
            f"{c:2d}: {m['rps']:6.1f} rps ({m['p50_ms']:.0f}/{m['p99_ms']:.0f} ms)" for c, m in med[name].items()
        )
        print(f"{name:26s} {cells}")
    on, off = med["bulkinfer, batching on"][32]["rps"], med["bulkinfer, batching off"][32]["rps"]
    anchor = (
        f"; bulkinfer (on) / LitServe = {on / med['LitServe anchor'][32]['rps']:.2f}"
        if "LitServe anchor" in med
        else ""
    )
    print(f"at 32 clients: batching on / off = {on / off:.2f}{anchor}")
    merge = statistics.median(merges)
    one, merged = model_ceiling(max(2, round(merge)), device)
    print(
        f"the model alone on these texts: {one:.1f} rows/s one row per call, {merged:.1f} in merges of "
        f"{round(merge)} rows (the server's median rows per call at 32 clients): batching can give at most "
        f"{merged / one:.2f}x on this machine; the server got {(on / off) / (merged / one):.0%} of that"
    )


if __name__ == "__main__":
    main()
