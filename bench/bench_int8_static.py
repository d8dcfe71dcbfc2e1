"""Static (calibrated) QDQ int8 against bulkinfer's dynamic int8, for the bundled MiniLM:
is it a candidate worth offering beside dynamic? (issue 18: "keep whichever passes the gate
faster").

Usage: .venv/bin/python bench/bench_int8_static.py [ROWS] [CALIBRATION_ROWS]

On ROWS catalog rows (default 2000): the fp32 ONNX model, bulkinfer's dynamic int8 (its
scheme for this CPU), and static QDQ int8 calibrated on CALIBRATION_ROWS of them (default
128; MinMax and Percentile calibration, activations u8 and s8, MatMuls only, per-channel
s8 weights) — each model run through the same adapter (tokenizer, length-sorted batches of
16, pooling), timed as the bare-engine limit is (no I/O), and gated against fp32 on the
first 512 rows (mean and minimum cosine, top-10 overlap). Prints the CPU beside them.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from machine import describe  # noqa: E402


def batches_of(adapter: Any, table: Any, size: int = 16) -> list[tuple[np.ndarray, Any]]:
    """(row indices, model inputs) in length-sorted batches, as a run forms them."""
    from bulkinfer.core.batching import plan_batches

    features = adapter.preprocess(table)
    return [(idx, adapter.select(features, idx)) for idx in plan_batches(adapter.cost(features), table.num_rows, size)]


def embed(adapter: Any, batches: list[tuple[np.ndarray, Any]], n: int) -> tuple[np.ndarray, float]:
    """Every row's embedding in row order, and rows/s of the calls (after one warm-up call)."""
    adapter.predict(batches[0][1])
    out: np.ndarray | None = None
    t0 = time.perf_counter()
    for idx, b in batches:
        got = np.asarray(adapter.predict(b), dtype=np.float32)
        if out is None:
            out = np.zeros((n, got.shape[1]), dtype=np.float32)
        out[idx] = got
    assert out is not None
    return out, n / (time.perf_counter() - t0)


def minilm(precision: str, cache: Path) -> Any:
    """The bundled MiniLM's text adapter on onnxruntime in ``precision``, set up (built into ``cache``)."""
    from bulkinfer import load_config
    from bulkinfer.adapters import SetupContext, build_adapter, resolve_model

    cfg = load_config(overrides={"model.name": "minilm", "model.text_column": "description",
                                 "runtime.engine": "onnxruntime", "runtime.precision": precision,
                                 "runtime.cache_dir": str(cache)})  # fmt: skip
    adapter = build_adapter(cfg, resolve_model(cfg))
    adapter.setup(SetupContext())
    return adapter


def use_model(adapter: Any, path: Path, skip_layer_norm: bool = False) -> None:
    """Point the adapter's ONNX Runtime session at another model file (same inputs and outputs),
    loaded as bulkinfer loads its own (without SkipLayerNormalization, unless asked)."""
    import onnxruntime as ort

    from bulkinfer.engines.ort_engine import CPU_UNFUSED

    so = ort.SessionOptions()
    so.intra_op_num_threads = len(__import__("os").sched_getaffinity(0))
    so.inter_op_num_threads = 1
    adapter._engine._session = ort.InferenceSession(
        str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=[] if skip_layer_norm else CPU_UNFUSED
    )


def static_int8(fp32: Path, out: Path, calibration: list[tuple[np.ndarray, Any]], method: str, signed: bool) -> float:
    """Quantize ``fp32`` statically (QDQ) from the calibration batches; seconds taken."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    width = max(b["input_ids"].shape[1] for _idx, b in calibration)  # one shape: histograms need it

    def padded(a: np.ndarray) -> np.ndarray:
        return np.pad(a, ((0, 0), (0, width - a.shape[1])))  # pad token 0, mask 0

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(
                [{"input_ids": padded(b["input_ids"]), "attention_mask": padded(b["attention_mask"])}
                 for _idx, b in calibration]
            )  # fmt: skip

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    t0 = time.perf_counter()
    quantize_static(
        str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8 if signed else QuantType.QUInt8, weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"], calibrate_method=getattr(CalibrationMethod, method),
        extra_options={"ActivationSymmetric": signed},
    )  # fmt: skip
    return time.perf_counter() - t0


def main() -> None:
    from bulkinfer.core.hardware import int8_scheme
    from bulkinfer.precision.gate import compare_embeddings

    from helpers import make_catalog

    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    calib_rows = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-int8-static-"))
    try:
        table = make_catalog(rows, seed=7).select(["description"])
        results: dict[str, tuple[float, dict[str, float], str]] = {}
        reference: np.ndarray | None = None
        adapters = {}
        for precision in ("fp32", "int8"):
            adapters[precision] = minilm(precision, work / "cache")
        fp32 = adapters["fp32"]
        batches = batches_of(fp32, table)
        reference, rate = embed(fp32, batches, rows)
        results["onnxruntime fp32"] = (rate, {"mean_cosine": 1.0}, "")
        got, rate = embed(adapters["int8"], batches, rows)
        scheme = "7-bit weights (reduce_range)" if int8_scheme()["reduce_range"] else "8-bit weights"
        results["dynamic int8 (bulkinfer's)"] = (rate, compare_embeddings(reference[:512], got[:512]), scheme)
        adapters["int8"].close()
        sample = table.slice(0, min(512, rows))
        calibration = batches_of(fp32, table.slice(0, calib_rows))
        for method in ("MinMax", "Percentile"):
            for signed in (False, True):
                name = f"static QDQ int8, {method}, {'s8' if signed else 'u8'} activations"
                out = work / f"static-{method}-{signed}.onnx"
                took = static_int8(fp32._engine.path, out, calibration, method, signed)
                use_model(fp32, out)
                got, rate = embed(fp32, batches, rows)
                results[name] = (rate, compare_embeddings(reference[: sample.num_rows], got[: sample.num_rows]),
                                 f"calibrated on {calib_rows} rows in {took:.1f} s")  # fmt: skip
        base = results["dynamic int8 (bulkinfer's)"][0]
        print(f"\n{rows} catalog rows, batches of 16, gate on the first {min(512, rows)} rows against fp32:")
        for name, (rate, q, note) in results.items():
            gate = ", ".join(f"{k} {v:.4f}" for k, v in q.items())
            print(f"  {name:48s} {rate:7.1f} rows/s  {rate / base:.2f}x dynamic int8  {gate}  {note}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
