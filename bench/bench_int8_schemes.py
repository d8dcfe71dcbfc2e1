"""Which dynamic int8 scheme fits which CPU kernels, for the bundled MiniLM: speed and the
gate's figures of each, in one run (issue 18: "choose the quantization scheme by the hardware").

Usage: .venv/bin/python bench/bench_int8_schemes.py [ROWS] [--repeat N]
       .venv/bin/python bench/as_avx2.py .venv/bin/python bench/bench_int8_schemes.py [ROWS]

The schemes (all per-channel weights, u8 activations quantized per call, MatMuls):
- s8 weights, 8 bits: ONNX Runtime's u8s8 kernels (VNNI's vpdpbusd where there is VNNI;
  on AVX2 vpmaddubsw, whose 16-bit pair sums saturate);
- s8 weights, 7 bits (``reduce_range``): the same kernels, no saturation, half the steps;
- u8 weights, 8 bits: the u8u8 kernels (on AVX2 widened to 16 bits before vpmaddwd: no
  saturation, full 8-bit steps, fewer products per instruction).
Then ONNX Runtime's block-wise weight quantization: MatMulNBits with 8-bit symmetric weights
in blocks (of 32 and of 128 input channels) and int8 compute (``accuracy_level`` 4, MLAS's
SQNBitGemm kernels), the fused Attention nodes' QKV in dynamic int8 (QAttention) or in fp32.
Beside them, the plain export bulkinfer used before the attention fusion (sdpa attention,
ONNX Runtime's basic optimizations) in fp32 and in bulkinfer's int8 scheme: what the fused
graph (EmbedLayerNormalization, Attention -> QAttention, BiasGelu) gains; and bulkinfer's
fp32 and int8 models with the residual Add and LayerNormalization fused into onnxruntime's
SkipLayerNormalization, as it loads them when not told otherwise (bulkinfer's export 2):
what leaving that fusion out gains on the CPU.
Each runs through the same adapter (tokenizer, length-sorted batches of 16, pooling), timed
as the bare-engine limit is (no I/O), rounds interleaved (median of N, default 3), and is
gated against fp32 on the first 512 rows. bulkinfer's own choice for this CPU is marked.
Prints the CPU beside them: run it natively and under bench/as_avx2.py to compare kinds.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from bench_int8_static import batches_of, embed, use_model  # noqa: E402
from machine import describe  # noqa: E402

SCHEMES = {  # name -> (weight type, reduce_range)
    "s8 weights, 8 bits": ("QInt8", False),
    "s8 weights, 7 bits (reduce_range)": ("QInt8", True),
    "u8 weights, 8 bits": ("QUInt8", False),
}
NBITS_BLOCKS = (32, 128)
"""Block sizes of the MatMulNBits 8-bit builds (issue 35 item 2's lead: block-wise weights with int8 compute)."""


def quantize(fp32: Path, out: Path, weight_type: str, reduce_range: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(fp32), str(out), weight_type=getattr(QuantType, weight_type), per_channel=True, reduce_range=reduce_range,
        extra_options={"DefaultTensorType": 1},  # fp32: the fused graph's contrib ops have no inferred types
    )  # fmt: skip


def nbits8(fp32: Path, out: Path, block: int, attention_int8: bool = True) -> Path:
    """Block-wise 8-bit weights in ONNX Runtime's MatMulNBits (symmetric, ``block`` input channels
    a scale, int8 compute: ``accuracy_level`` 4) for every MatMul; a fused Attention node's QKV
    product, which MatMulNBits cannot take, goes to dynamic int8 (QAttention) when
    ``attention_int8``, else stays fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from bulkinfer.core.hardware import int8_scheme

    src = fp32
    if attention_int8:
        src = out.with_suffix(".attention.onnx")
        quantize_dynamic(
            str(fp32), str(src), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["Attention"],
            reduce_range=int8_scheme()["reduce_range"], extra_options={"DefaultTensorType": 1},
        )  # fmt: skip
    q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=8, block_size=block, is_symmetric=True, accuracy_level=4)
    q.process()
    q.model.save_model_to_file(str(out), use_external_data_format=False)
    return out


def plain(model_dir: str, out: Path) -> None:
    """The model exported without the attention fusion: sdpa attention, basic optimizations."""
    from bulkinfer.engines.ort_engine import _export, optimize_basic

    raw = out.with_suffix(".raw.onnx")
    _export(model_dir, raw)
    optimize_basic(raw, out)


def main() -> None:
    from bulkinfer import load_config
    from bulkinfer.adapters import SetupContext, build_adapter, resolve_model
    from bulkinfer.core.hardware import int8_scheme
    from bulkinfer.precision.gate import compare_embeddings

    from helpers import make_catalog

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows = int(args[0]) if args else 1000
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    print(describe())
    ours = next(n for n, (w, r) in SCHEMES.items() if w == "QInt8" and r == int8_scheme()["reduce_range"])
    work = Path(tempfile.mkdtemp(prefix="bench-int8-schemes-"))
    try:
        table = make_catalog(rows, seed=7).select(["description"])
        cfg = load_config(
            overrides={"model.name": "minilm", "model.text_column": "description", "runtime.cache_dir": str(work)}
        )
        adapter = build_adapter(cfg, resolve_model(cfg))
        adapter.setup(SetupContext())
        batches = batches_of(adapter, table)
        fp32_path = adapter._engine.path
        models = {"onnxruntime fp32 (bulkinfer's export)": fp32_path}
        for name, (weights, reduce_range) in SCHEMES.items():
            models[name] = work / f"{weights}-{reduce_range}.onnx"
            quantize(fp32_path, models[name], weights, reduce_range)
        for block in NBITS_BLOCKS:
            models[f"MatMulNBits 8-bit, blocks of {block}"] = nbits8(fp32_path, work / f"nbits{block}.onnx", block)
        models["MatMulNBits 8-bit, blocks of 32, attention fp32"] = nbits8(
            fp32_path, work / "nbits32-fp32-attention.onnx", 32, attention_int8=False
        )
        models["fp32, plain export"] = work / "plain.onnx"
        plain(resolve_model(cfg).location, models["fp32, plain export"])
        models[f"{ours}, plain export"] = work / "plain-int8.onnx"
        quantize(models["fp32, plain export"], models[f"{ours}, plain export"], "QInt8", int8_scheme()["reduce_range"])
        skip_fused = {
            "fp32, SkipLayerNormalization fused": fp32_path,
            f"{ours}, SkipLayerNormalization fused": models[ours],
        }
        models.update(skip_fused)
        rates: dict[str, list[float]] = {name: [] for name in models}
        gate: dict[str, dict[str, float]] = {}
        reference = None
        for _ in range(repeat):
            for name, path in models.items():
                use_model(adapter, path, skip_layer_norm=name in skip_fused)
                got, rate = embed(adapter, batches, rows)
                rates[name].append(rate)
                if reference is None:
                    reference = got
                n = min(512, rows)
                gate.setdefault(name, compare_embeddings(reference[:n], got[:n]))
        base = statistics.median(rates["onnxruntime fp32 (bulkinfer's export)"])
        print(f"\n{rows} catalog rows, batches of 16, median of {repeat}; gate on the first {min(512, rows)} rows:")
        for name, r in rates.items():
            rate = statistics.median(r)
            q = ", ".join(f"{k} {v:.4f}" for k, v in gate[name].items())
            mark = "  <- bulkinfer's scheme here" if name == ours else ""
            print(f"  {name:40s} {rate:7.1f} rows/s  {rate / base:.2f}x fp32  {q}{mark}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
