"""Whether the gate's fp32 reference pass pays to run while the int8 model is built (issue 35,
item 1: "the fp32 reference pass and the int8 build overlap where the cores allow").

Usage: .venv/bin/python bench/bench_overlap.py [ROUNDS] [--rows N]

The bundled MiniLM, its fp32 export made once; then ROUNDS rounds (default 5) of the two set-up
steps a cold int8 job takes after the export, each round both ways in turn:
- one after the other: the int8 build (bulkinfer's quantization, into a fresh folder), then the
  fp32 reference pass (load the fp32 model, infer the gate's N rows, default 512);
- overlapped: the reference pass in a thread while this thread builds.
Prints each round's seconds and the median saving, beside the CPU's flags. On the 2-core
development VM the build holds a core and the GIL (it is Python and protobuf work), so the
overlapped reference runs about 1.7x slower and little is saved; a machine with more cores
may differ, which is what this script is for.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from bench_int8_static import minilm  # noqa: E402
from machine import describe  # noqa: E402


def main() -> None:
    from bulkinfer.engines.ort_engine import build_entry, cache_entry
    from bulkinfer.precision.gate import run_adapter

    from helpers import make_catalog

    args = sys.argv[1:]
    rows = int(args[args.index("--rows") + 1]) if "--rows" in args else 512
    rounds = int(args[0]) if args and args[0].isdigit() else 5
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-overlap-"))
    try:
        cache = work / "cache"
        fp32 = minilm("fp32", cache)  # the export, once: both ways start after it
        fp32_entry = cache_entry(cache, fp32.model_digest, "fp32")
        model_dir = str(fp32.layout.transformer_dir)
        fp32.close()
        sample = make_catalog(rows, seed=11).select(["description"])

        def build() -> float:
            entry = work / "int8"
            shutil.rmtree(entry, ignore_errors=True)
            t0 = time.perf_counter()
            build_entry(model_dir, "int8", entry, fp32_entry)
            return time.perf_counter() - t0

        def reference() -> float:
            t0 = time.perf_counter()
            adapter = minilm("fp32", cache)  # a cache hit: the load, as the gate's reference loads it
            run_adapter(adapter, sample, 16)
            adapter.close()
            return time.perf_counter() - t0

        saved = []
        for n in range(rounds):
            t0 = time.perf_counter()
            b, r = build(), reference()
            apart = time.perf_counter() - t0
            took: list[float] = []
            thread = threading.Thread(target=lambda out=took: out.append(reference()))
            t0 = time.perf_counter()
            thread.start()
            b2 = build()
            thread.join()
            together = time.perf_counter() - t0
            saved.append(apart - together)
            print(f"round {n + 1}: one after the other {apart:.2f} s (build {b:.2f}, reference {r:.2f}); "
                  f"overlapped {together:.2f} s (build {b2:.2f}, reference {took[0]:.2f}); "
                  f"saved {apart - together:+.2f} s")  # fmt: skip
        print(f"median saving over {rounds} rounds: {statistics.median(saved):+.2f} s "
              f"(min {min(saved):+.2f}, max {max(saved):+.2f}); reference pass over {rows} rows")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
