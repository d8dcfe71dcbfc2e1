"""Online, side by side, one run: `bulkinfer serve` with dynamic batching on and off, and
the LitServe anchor (../shared/bench/anchor_litserve.py, max batch 32, 10 ms window).

Usage: .venv/bin/python bench/bench_serve.py [--requests N]

Each server is started on loopback and driven by ../shared/bench/load_embed.py (closed
loop, one text per request, bounded in count and time) at 1, 8 and 32 concurrent
clients; it prints requests/s (= rows/s), p50 and p99 latency, errors, and the ratio of
batching on to batching off at 32 clients. The load generator shares the machine's CPUs
with the server, as it would on a small box.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "bench"
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


def main() -> None:
    total = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 320
    exe = str(Path(sys.executable).parent / "bulkinfer")
    setups = {
        "bulkinfer, batching on": (
            lambda port: [exe, "serve", "-m", "minilm", "--text-column", "text", "--port", str(port), "-q"],
            "/v1/embeddings", "openai", "/readyz",
        ),
        "bulkinfer, batching off": (
            lambda port: [exe, "serve", "-m", "minilm", "--text-column", "text", "--port", str(port), "-q",
                          "--set", "serve.max_batch_size=1", "--set", "serve.max_wait_ms=0"],
            "/v1/embeddings", "openai", "/readyz",
        ),
        "LitServe anchor": (
            lambda port: [sys.executable, str(SHARED / "anchor_litserve.py"), str(port), "32", "0.01"],
            "/predict", "litserve", "/health",
        ),
    }  # fmt: skip
    results: dict[str, dict[int, dict[str, float]]] = {}
    for name, (cmd, route, kind, ready) in setups.items():
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start(cmd(port), base + ready)
        try:
            while httpx.get(base + ready, timeout=2).status_code != 200:  # bulkinfer: model loaded
                time.sleep(0.5)
            load(base + route, kind, 4, 16)  # warm-up
            results[name] = {}
            for c in CLIENTS:
                r = load(base + route, kind, c, total)
                results[name][c] = r
                print(
                    f"{name:26s} clients={c:2d} rps={r['rps']:6.1f} p50={r['p50_ms']:5.0f} ms "
                    f"p99={r['p99_ms']:5.0f} ms errors={int(r['errors'])}",
                    flush=True,
                )
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
            time.sleep(1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    on, off = results["bulkinfer, batching on"][32]["rps"], results["bulkinfer, batching off"][32]["rps"]
    anchor = results["LitServe anchor"][32]["rps"]
    print(f"\nat 32 clients: batching on / off = {on / off:.2f}; bulkinfer (on) / LitServe = {on / anchor:.2f}")


if __name__ == "__main__":
    main()
