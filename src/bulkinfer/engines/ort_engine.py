"""The ONNX Runtime engine: export the transformer once, optimise (and quantise) it once,
cache the result on disk, and run it with ONNX Runtime.

Cache layout: ``<runtime.cache_dir>/onnx/<key>/model.onnx`` where ``key`` hashes the
model's content digest, the precision, the opset, the export's version, the machine kind
and the versions of torch, transformers and onnxruntime; a changed model or library gets a
new entry.

A BERT encoder (``model_type = "bert"``, right-padding tokenizer) is exported with eager
attention and fused by ONNX Runtime's transformer optimizer (EmbedLayerNormalization,
Attention, BiasGelu; int8 then quantizes Attention to QAttention, one product for Q, K and
V): measured on MiniLM (``bench/bench_int8_schemes.py``) int8 +22% and fp32 +12% on
AVX-512/VNNI, +5 to +16% and +6% on AVX2 kernels, same cosine. The fused graph is kept only
when it gives the plain graph's output on a probe batch; otherwise, and for other models,
the plain export is used.

The residual Add and LayerNormalization are *not* fused into SkipLayerNormalization, by the
optimizer or by ONNX Runtime when a CPU session loads (``disabled_optimizers``): on the CPU
onnxruntime's SkipLayerNormalization is 2.5 to 5 times slower than Add + LayerNormalization
(2.6 against 0.8 to 1.1 ns an element here), about 14% of MiniLM's int8 time; leaving it
out measured int8 +18% on AVX-512/VNNI and +8.5% on AVX2 kernels, fp32 +6.5% and +0%
(``bench/bench_int8_schemes.py``). On a GPU the fused kernel stays.

On a GPU the session runs on ONNX Runtime's CUDA provider, or through TensorRT
(``runtime.tensorrt``: the plain graph, one optimization profile up to the batch size, its
engines cached in ``<key>/tensorrt/<card>-...``); a session ONNX Runtime started on a fallback provider
is refused (:func:`started`).

Entries are built in a temporary folder and renamed into place, so a crash never leaves half an
entry, and two jobs building the same entry both end up with a whole one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ModelError
from ..core.hardware import ORT_GPU_PROVIDERS, int8_scheme, isa_key
from .int8 import OUTLIER_SHARE, OUTLIERS
from .versions import EXPORT, OPSET

__all__ = ["EXPORT", "OPSET", "OrtEngine", "build_entry", "cache_entry", "started", "tensorrt_options"]

log = logging.getLogger("bulkinfer")


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Please consider to run pre-processing before quantization")


CPU_UNFUSED = ["SkipLayerNormFusion"]  # onnxruntime's fusions a CPU session skips (see above)


def _versions() -> dict[str, str]:
    """The exporting libraries' versions (part of a cache entry's key), read from their installed
    metadata: importing torch and transformers to ask would cost seconds at every start."""
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "transformers", "onnxruntime")}


def cache_entry(
    cache_dir: Path, model_digest: str, precision: str, keep_fp32: Sequence[str] = (), fuse: bool = True
) -> Path:
    """Where the compiled model for (model, precision, opset, library versions, groups kept
    in fp32, fused or not) lives."""
    scheme: dict[str, Any] = int8_scheme() if precision == "int8" else {}
    if keep_fp32:
        scheme["fp32_groups"] = sorted(keep_fp32)
    if OUTLIERS in keep_fp32:  # how the channels are chosen: a change there is a new build
        scheme["outlier_share"] = OUTLIER_SHARE
    if not fuse:
        scheme["fuse"] = False
    body = json.dumps(
        {
            "model": model_digest,
            "precision": precision,
            "opset": OPSET,
            "export": EXPORT,
            "isa": isa_key(),
            **scheme,
            **_versions(),
        },
        sort_keys=True,
    )
    return cache_dir / "onnx" / hashlib.sha256(body.encode()).hexdigest()[:20]


def _export(model_dir: str, out: Path, eager: bool = False) -> None:
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    attention: dict[str, Any] = {"attn_implementation": "eager"} if eager else {}  # the pattern the fusion knows
    model = AutoModel.from_pretrained(model_dir, local_files_only=True, **attention).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.ones((2, 8), dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes about constants that do not vary for an encoder
        torch.onnx.export(
            LastHidden(model),
            (ids, torch.ones_like(ids)),
            str(out),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            opset_version=OPSET,
            dynamo=False,
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
        )


def optimize_basic(raw: Path, out: Path) -> None:
    """``raw`` with ONNX Runtime's basic (hardware-independent) graph optimizations, saved to ``out``:
    the plain export's graph."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(raw), so, providers=["CPUExecutionProvider"])


def _fusable(model_dir: str) -> dict[str, int] | None:
    """``{"num_heads", "hidden_size", "vocab_size"}`` of a BERT encoder whose tokenizer pads on the right (the
    fused attention reads the mask as a length per row), else None."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        tokenizer_path = Path(model_dir) / "tokenizer_config.json"
        tokenizer = json.loads(tokenizer_path.read_text()) if tokenizer_path.is_file() else {}
    except (OSError, ValueError):
        return None
    if config.get("model_type") != "bert" or tokenizer.get("padding_side", "right") != "right":
        return None
    try:
        keys = {"num_heads": "num_attention_heads", "hidden_size": "hidden_size", "vocab_size": "vocab_size"}
        return {ours: int(config[theirs]) for ours, theirs in keys.items()}
    except (KeyError, TypeError, ValueError):
        return None


def _probe(vocab: int) -> dict[str, np.ndarray]:
    """Three right-padded rows of 5, 11 and 16 tokens (ids from the vocabulary, fixed seed)."""
    rng = np.random.default_rng(0)
    lengths = [5, 11, 16]
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, vocab, n)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _fuse(raw: Path, out: Path, shape: dict[str, int]) -> dict[str, int] | None:
    """``raw`` fused into ``out`` by onnxruntime's BERT optimizer: the fused operators' counts,
    or None (``out`` not written) when nothing fused or the fused output differs from the
    plain one's on :func:`_probe` (relative error over 1e-4 on any real token)."""
    import onnxruntime as ort
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False  # slower than what it replaces on the CPU (module docstring)
    try:
        fused = optimize_model(
            str(raw), model_type="bert", opt_level=0, num_heads=shape["num_heads"], hidden_size=shape["hidden_size"],
            optimization_options=options,
        )  # fmt: skip
    except Exception as exc:  # a pattern the optimizer cannot handle: the plain graph
        log.debug("attention fusion skipped (%s: %s)", type(exc).__name__, exc)
        return None
    ops = {k: int(v) for k, v in fused.get_fused_operator_statistics().items() if v}
    if not ops.get("Attention"):
        return None
    fused.save_model_to_file(str(out))
    batch = _probe(shape["vocab_size"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    plain, got = (
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, batch)[0]
        for path in (raw, out)
    )
    real = batch["attention_mask"].astype(bool)
    err = float(np.linalg.norm(got[real] - plain[real]) / max(float(np.linalg.norm(plain[real])), 1e-12))
    if err > 1e-4:
        log.debug("attention fusion not kept: relative error %.2g on the probe", err)
        out.unlink()
        return None
    return ops


def build_entry(
    model_dir: str,
    precision: str,
    entry: Path,
    fp32_entry: Path | None = None,
    keep_fp32: Sequence[str] = (),
    fuse: bool = True,
) -> None:
    """Export, optimize (and for int8 quantize) into a temporary folder, then rename it to
    ``entry``. int8 quantizes the fp32 entry's model (``fp32_entry``, built first when missing),
    so trying both precisions (``bulkinfer tune``) exports the model once. ``fuse=False``: the
    plain graph even for a BERT encoder (TensorRT fuses it itself, and runs no contrib operators)."""
    if precision == "int8" and fp32_entry is not None and not (fp32_entry / "model.onnx").is_file():
        build_entry(model_dir, "fp32", fp32_entry)

    entry.parent.mkdir(parents=True, exist_ok=True)
    for stale in entry.parent.glob(".build-*"):  # left by a build that was killed
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=entry.parent))
    try:
        t0 = time.perf_counter()
        optimized = work / "model.onnx" if precision == "fp32" else work / "fp32.onnx"
        graph = _fp32_graph(model_dir, work, optimized, fp32_entry if precision == "int8" else None, fuse)
        scheme: dict[str, Any] = {}
        if precision == "int8":
            scheme = _quantize(model_dir, optimized, work / "model.onnx", fp32_entry, keep_fp32)
        for f in work.iterdir():
            if f.name != "model.onnx":
                f.unlink()
        meta = {"precision": precision, "opset": OPSET, "isa": isa_key(), **_versions(),  # isa: part of the key
                "build_s": round(time.perf_counter() - t0, 2), **graph, **scheme}  # fmt: skip
        (work / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(work, entry)
        except OSError:  # another job built the same entry first: use theirs
            if not (entry / "model.onnx").is_file():
                raise
        log.info(
            "compiled the model for onnxruntime/%s%s in %.1f s (cached in %s)",
            precision, ", attention fused" if graph else "", time.perf_counter() - t0, entry,
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fp32_graph(model_dir: str, work: Path, optimized: Path, fp32_entry: Path | None, fuse: bool) -> dict[str, Any]:
    """The optimized fp32 graph at ``optimized``: copied from ``fp32_entry`` when given (an int8
    build quantizes it), else exported and fused (a BERT encoder, ``fuse``) or basic-optimized.
    Returns the fused operators for the entry's meta (empty when not fused)."""
    if fp32_entry is not None:
        shutil.copyfile(fp32_entry / "model.onnx", optimized)
        with contextlib.suppress(OSError, ValueError):  # quantized from a fused graph: say so here too
            return {k: v for k, v in json.loads((fp32_entry / "meta.json").read_text()).items() if k == "fused"}
        return {}
    raw = work / "raw.onnx"
    shape = _fusable(model_dir) if fuse else None
    _export(model_dir, raw, eager=shape is not None)
    fused = _fuse(raw, optimized, shape) if shape is not None else None
    if fused is not None:
        return {"fused": fused}
    optimize_basic(raw, optimized)
    return {}


def _quantize(
    model_dir: str, optimized: Path, dest: Path, fp32_entry: Path | None, keep_fp32: Sequence[str]
) -> dict[str, Any]:
    """``optimized`` quantized to int8 at ``dest`` (per-channel weights: per-tensor int8 is as fast
    but far off fp32, cosine ~0.93 on MiniLM), ``keep_fp32``'s groups left in fp32; the scheme for
    the entry's meta."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .int8 import group_of, layer_groups, outlier_channels, split_outliers

    scheme: dict[str, Any] = int8_scheme()
    exclude: list[str] = []
    if OUTLIERS in keep_fp32:  # each feed-forward block's largest channels beside the int8 rest
        import onnx

        # found on the fp32 entry's file (the same graph as this copy), once per process
        channels = outlier_channels(fp32_entry / "model.onnx" if fp32_entry else optimized, model_dir)
        if not channels:
            log.warning("int8: %s has no fused feed-forward blocks to split; %s has no effect", model_dir, OUTLIERS)
        else:
            model = onnx.load(str(optimized))
            exclude += split_outliers(model, channels)
            onnx.save(model, str(optimized))
            scheme["outlier_channels"] = {group_of(k).split("/")[0]: v for k, v in channels.items()}
    groups = layer_groups(optimized)
    exclude += [node for g in keep_fp32 for node in groups.get(g, [])]
    advice = _DropAdvice()  # the quantizer's "run pre-processing first": done above, not the user's to do
    logging.root.addFilter(advice)
    try:
        quantize_dynamic(
            str(optimized), str(dest), weight_type=QuantType.QInt8, per_channel=True,
            nodes_to_exclude=exclude, reduce_range=scheme["reduce_range"],
            extra_options={"DefaultTensorType": 1},  # fp32: a fused graph's contrib ops have no inferred types
        )  # fmt: skip
    finally:
        logging.root.removeFilter(advice)
    if keep_fp32:
        scheme["fp32_groups"] = sorted(keep_fp32)
    return scheme


def tensorrt_options(engines: Path, precision: str, device_id: int, rows: int, tokens: int) -> dict[str, Any]:
    """ONNX Runtime's TensorRT provider options for batches of up to ``rows`` x ``tokens``: one
    optimization profile from 1x1 to that (so the varying shapes of length-sorted batches reuse
    one engine instead of building one per shape), engines and timing cache kept in ``engines``
    (a folder per precision and profile inside the cache entry, which is keyed by the model,
    the machine kind and onnxruntime's version), fp16 kernels for ``precision = "fp16"``."""

    def shape(r: int, t: int) -> str:
        return ",".join(f"{name}:{r}x{t}" for name in ("input_ids", "attention_mask"))

    return {
        "device_id": device_id,
        "trt_fp16_enable": precision == "fp16",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(engines),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(engines),
        "trt_profile_min_shapes": shape(1, 1),
        "trt_profile_opt_shapes": shape(rows, min(tokens, 128)),
        "trt_profile_max_shapes": shape(rows, tokens),
    }


def started(providers: Sequence[str], wanted: str, device: str) -> None:
    """Refuse a session that did not start on ``wanted``: ONNX Runtime falls back to the next
    provider (TensorRT to CUDA, CUDA to the CPU) with a logged error when a provider's libraries
    do not load, and a GPU job must not run on the CPU, or a TensorRT job without TensorRT, unseen."""
    if providers and providers[0] == wanted:
        return
    _name, _install, instead = ORT_GPU_PROVIDERS[wanted]
    libraries = (
        "TensorRT libraries it was built for (pip install tensorrt)"
        if wanted == "TensorrtExecutionProvider"
        else "CUDA and cuDNN libraries it was built for"
    )
    raise ModelError(
        f"runtime.device = {device}: onnxruntime could not start {wanted} here and fell back to "
        f"{', '.join(providers) or 'nothing'} (its log above says why); install the {libraries}, or set {instead}"
    )


def _provider_wanted(precision: str, device: str, tensorrt: tuple[int, int] | None) -> str:
    """The GPU provider the job needs ("" on the CPU); refused, before anything is exported, when
    the precision does not run on onnxruntime or this onnxruntime lacks the provider."""
    import onnxruntime as ort

    if precision not in ("fp32", "int8") and not (tensorrt and precision == "fp16"):
        raise ModelError(
            f"runtime.precision: {precision!r} is not supported by onnxruntime; use fp32 or int8 "
            "(fp16 through TensorRT: runtime.tensorrt = true; bf16 runs on the torch engine)"
        )
    wanted = "TensorrtExecutionProvider" if tensorrt else "CUDAExecutionProvider" if device.startswith("cuda") else ""
    if wanted and wanted not in ort.get_available_providers():
        name, install, instead = ORT_GPU_PROVIDERS[wanted]
        raise ModelError(
            f"runtime.device = {device}: this onnxruntime ({ort.__version__}) has no {name} provider "
            f"({', '.join(ort.get_available_providers())}); {install}, or set {instead}"
        )
    return wanted


def _providers(entry: Path, device: str, precision: str, tensorrt: tuple[int, int] | None) -> list[Any]:
    """The session's providers, first choice first: TensorRT (its engines cached per card, precision
    and profile inside ``entry``), CUDA, the CPU."""
    device_id = int(device.partition(":")[2] or 0)
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device_id}))
    if tensorrt:
        from ..core.hardware import gpu

        rows, tokens = tensorrt
        card = re.sub(r"[^A-Za-z0-9]+", "-", (gpu(device) or {}).get("name", "gpu")).strip("-")
        engines = entry / "tensorrt" / f"{card}-{precision}-{rows}x{tokens}"  # an engine is built for one card
        engines.mkdir(parents=True, exist_ok=True)
        if not any(engines.iterdir()):  # empty also after a start that failed
            log.info("building TensorRT engines for up to %d rows x %d tokens (once; cached in %s)",
                     rows, tokens, engines)  # fmt: skip
        providers.insert(
            0, ("TensorrtExecutionProvider", tensorrt_options(engines, precision, device_id, rows, tokens))
        )
    return providers


class OrtEngine:
    """Runs a cached ONNX export of a transformer with ONNX Runtime: on the CPU, on CUDA, or on
    CUDA through TensorRT (``tensorrt``: the most rows and tokens per call it is built for)."""

    def __init__(
        self,
        model_dir: str,
        *,
        device: str,
        threads: int,
        precision: str,
        model_digest: str,
        cache_dir: Path,
        spin: bool = True,
        keep_fp32: Sequence[str] = (),
        tensorrt: tuple[int, int] | None = None,
    ) -> None:
        import onnxruntime as ort

        wanted = _provider_wanted(precision, device, tensorrt)
        # TensorRT takes the plain fp32 graph whatever the precision (its fp16 is its own kernels)
        built = "fp32" if tensorrt else precision
        entry = cache_entry(cache_dir, model_digest, built, keep_fp32, fuse=tensorrt is None)
        self.fp32_path = cache_entry(cache_dir, model_digest, "fp32") / "model.onnx"
        self.cache_hit = (entry / "model.onnx").is_file()
        self.build_split: dict[str, float] = {}  # seconds of this load's export and int8 build (none: cached)
        if not self.cache_hit:
            self._compile(model_dir, built, entry, keep_fp32, fuse=tensorrt is None)
        self.path = entry / "model.onnx"
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if not spin:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = _providers(entry, device, precision, tensorrt)
        if not wanted:
            self._session = ort.InferenceSession(
                str(self.path), so, providers=providers, disabled_optimizers=CPU_UNFUSED
            )
        else:
            try:  # no silent fallback to another provider, here or in a later run() (onnxruntime's default)
                self._session = ort.InferenceSession(str(self.path), so, providers=providers, enable_fallback=0)
            except Exception as exc:  # onnxruntime's own exception types (Fail, EPFail) are not RuntimeErrors
                cause = " ".join(str(exc).split())[:300]
                raise ModelError(
                    f"runtime.device = {device}: onnxruntime could not start {wanted} here ({cause})"
                ) from exc
            started(self._session.get_providers(), wanted, device)
        ran = self._session.get_providers()[0]
        on_gpu = device.startswith("cuda")
        self.runs_on = f"onnxruntime {ran}" + (f" ({device})" if on_gpu else "")  # what report.json says ran

    def _compile(self, model_dir: str, built: str, entry: Path, keep_fp32: Sequence[str], fuse: bool) -> None:
        """Build the cache entry (for int8, the fp32 export first), timing each step."""
        try:
            if built == "int8" and not self.fp32_path.is_file():  # the export, then its quantization
                t0 = time.perf_counter()
                build_entry(model_dir, "fp32", self.fp32_path.parent)
                self.build_split["export_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            build_entry(model_dir, built, entry, self.fp32_path.parent, keep_fp32, fuse=fuse)
            self.build_split["export_s" if built == "fp32" else "build_s"] = time.perf_counter() - t0
        except (OSError, RuntimeError, ValueError) as exc:
            raise ModelError(f"{model_dir}: cannot export to ONNX ({type(exc).__name__}: {exc})") from exc

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = self._session.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]
        return np.asarray(out, dtype=np.float32)
