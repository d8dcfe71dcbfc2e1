"""Where the int8 graph's time goes, per op type, on this machine (issue 35, item 2).

Usage: .venv/bin/python bench/profile_ops.py [ROWS] [--nbits]
       .venv/bin/python bench/as_avx2.py .venv/bin/python bench/profile_ops.py [ROWS]   (simulated AVX2)

The bundled MiniLM over ROWS catalog rows (default 1000), through the adapter as a run forms
its batches (tokenizer, length-sorted batches of 16), once per model: bulkinfer's fp32 export
and the int8 build it makes for this CPU (and, with ``--nbits``, the MatMulNBits 8-bit build
of bench_int8_schemes.py). Each runs in one ONNX Runtime session with profiling on, loaded as
bulkinfer loads it (threads, fusions); after one warm-up batch, every kernel's time is summed
by op type. Printed per model: each op type's share of the kernels' time, its calls and its
mean time a call, and the share that is matrix-product work (MatMul and its int8 and
block-quantized forms, Attention) against the rest (quantize/dequantize, normalizations,
activations, copies): the rest is what the int8 graph could lose. The CPU's flags are
printed first; figures under bench/as_avx2.py are simulated, not the AVX2 kind's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from bench_int8_static import batches_of, minilm  # noqa: E402
from machine import describe  # noqa: E402

PRODUCTS = {
    "MatMul",
    "FusedMatMul",
    "Gemm",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "MatMulNBits",
    "Attention",
    "QAttention",
    "MultiHeadAttention",
}
"""Op types whose time is matrix products: what int8 is for."""


def profile(path: Path, batches: list[tuple[Any, Any]], prefix: Path) -> tuple[dict[str, list[float]], float]:
    """Per op type [microseconds, calls] over ``batches`` (after one warm-up), and the wall seconds."""
    import time

    import onnxruntime as ort

    from bulkinfer.engines.ort_engine import CPU_UNFUSED

    so = ort.SessionOptions()
    so.intra_op_num_threads = len(os.sched_getaffinity(0))
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = str(prefix)
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=CPU_UNFUSED)
    names = {i.name for i in session.get_inputs()}

    def feed(b: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in b.items() if k in names}

    session.run(None, feed(batches[0][1]))
    t0 = time.perf_counter()
    for _, b in batches:
        session.run(None, feed(b))
    wall = time.perf_counter() - t0
    events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if runs < 1:  # the warm-up run's kernels (its model_run event is written after them)
            continue
        op = e.get("args", {}).get("op_name", "?")
        by_op[op][0] += float(e["dur"])
        by_op[op][1] += 1
    return dict(by_op), wall


def report(name: str, by_op: dict[str, list[float]], wall: float, rows: int) -> None:
    total = sum(us for us, _ in by_op.values()) or 1.0
    products = sum(us for op, (us, _) in by_op.items() if op in PRODUCTS)
    print(f"\n{name}: {rows / wall:.1f} rows/s (profiled), kernels {total / 1e6:.2f} s of {wall:.2f} s wall")
    print(f"  matrix products {100 * products / total:.1f}%, the rest {100 * (total - products) / total:.1f}%")
    for op, (us, calls) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        if us / total < 0.002:
            continue
        mark = "" if op in PRODUCTS else "   (not a product)"
        print(f"  {op:28s} {100 * us / total:5.1f}%  {int(calls):6d} calls  {us / calls:8.1f} us a call{mark}")


def main() -> None:
    from bench_int8_schemes import nbits8

    from helpers import make_catalog

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows = int(args[0]) if args else 1000
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-profile-ops-"))
    try:
        table = make_catalog(rows, seed=7).select(["description"])
        models: dict[str, Path] = {}
        batches = None
        for precision in ("fp32", "int8"):
            adapter = minilm(precision, work / "cache")
            models[f"onnxruntime {precision} (bulkinfer's build here)"] = adapter._engine.path
            batches = batches or batches_of(adapter, table)
        if "--nbits" in sys.argv:
            fp32 = next(iter(models.values()))
            models["MatMulNBits 8-bit, int8 compute"] = nbits8(fp32, work / "nbits8.onnx", 32)
        assert batches is not None
        for name, path in models.items():
            by_op, wall = profile(path, batches, work / "profile")
            report(name, by_op, wall, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
