"""The ONNX Runtime engine: export the transformer once, optimise (and quantise) it once,
cache the result on disk, and run it with ONNX Runtime.

Cache layout: ``<runtime.cache_dir>/onnx/<key>/model.onnx`` where ``key`` hashes the
model's content digest, the precision, the opset and the versions of torch,
transformers and onnxruntime; a changed model or library gets a new entry. Entries are
built in a temporary folder and renamed into place, so a crash never leaves half an
entry, and two jobs building the same entry both end up with a whole one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError
from ..hardware import int8_scheme, isa_key

__all__ = ["OPSET", "OrtEngine", "cache_entry"]

log = logging.getLogger("bulkinfer")


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Please consider to run pre-processing before quantization")


OPSET = 17


def _versions() -> dict[str, str]:
    import onnxruntime
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def cache_entry(cache_dir: Path, model_digest: str, precision: str, keep_fp32: Sequence[str] = ()) -> Path:
    """Where the compiled model for (model, precision, opset, library versions, groups kept
    in fp32) lives."""
    scheme: dict[str, Any] = int8_scheme() if precision == "int8" else {}
    if keep_fp32:
        scheme["fp32_groups"] = sorted(keep_fp32)
    body = json.dumps(
        {"model": model_digest, "precision": precision, "opset": OPSET, "isa": isa_key(), **scheme, **_versions()},
        sort_keys=True,
    )
    return cache_dir / "onnx" / hashlib.sha256(body.encode()).hexdigest()[:20]


def _export(model_dir: str, out: Path) -> None:
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModel.from_pretrained(model_dir, local_files_only=True).eval()

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


def _build(
    model_dir: str, precision: str, entry: Path, fp32_entry: Path | None = None, keep_fp32: Sequence[str] = ()
) -> None:
    """Export, optimize (and for int8 quantize) into a temporary folder, then rename it to
    ``entry``. int8 quantizes the fp32 entry's model (``fp32_entry``, built first when missing),
    so trying both precisions (``bulkinfer tune``) exports the model once."""
    import onnxruntime as ort

    if precision == "int8" and fp32_entry is not None and not (fp32_entry / "model.onnx").is_file():
        _build(model_dir, "fp32", fp32_entry)

    entry.parent.mkdir(parents=True, exist_ok=True)
    for stale in entry.parent.glob(".build-*"):  # left by a build that was killed
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=entry.parent))
    try:
        t0 = time.perf_counter()
        optimized = work / "model.onnx" if precision == "fp32" else work / "fp32.onnx"
        if precision == "int8" and fp32_entry is not None:
            shutil.copyfile(fp32_entry / "model.onnx", optimized)
        else:
            raw = work / "raw.onnx"
            _export(model_dir, raw)
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.optimized_model_filepath = str(optimized)
            ort.InferenceSession(str(raw), so, providers=["CPUExecutionProvider"])
        scheme: dict[str, Any] = int8_scheme() if precision == "int8" else {}
        if precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # per-channel weights: per-tensor int8 is as fast but far off fp32 (cosine ~0.93 on MiniLM)
            from .int8 import layer_groups

            groups = layer_groups(optimized)
            exclude = [node for g in keep_fp32 for node in groups.get(g, [])]
            advice = _DropAdvice()  # the quantizer's "run pre-processing first": done above, not the user's to do
            logging.root.addFilter(advice)
            try:
                quantize_dynamic(
                    str(optimized), str(work / "model.onnx"), weight_type=QuantType.QInt8, per_channel=True,
                    nodes_to_exclude=exclude, reduce_range=scheme["reduce_range"],
                )  # fmt: skip
            finally:
                logging.root.removeFilter(advice)
            if keep_fp32:
                scheme = {**scheme, "fp32_groups": sorted(keep_fp32)}
        for f in work.iterdir():
            if f.name != "model.onnx":
                f.unlink()
        (work / "meta.json").write_text(
            json.dumps(
                {
                    "precision": precision,
                    "opset": OPSET,
                    "isa": isa_key(),  # the machine kind it was built for (part of the entry's key)
                    **_versions(),
                    "build_s": round(time.perf_counter() - t0, 2),
                    **scheme,
                }
            )
        )
        try:
            os.rename(work, entry)
        except OSError:  # another job built the same entry first: use theirs
            if not (entry / "model.onnx").is_file():
                raise
        log.info(
            "compiled the model for onnxruntime/%s in %.1f s (cached in %s)", precision, time.perf_counter() - t0, entry
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


class OrtEngine:
    """Runs a cached ONNX export of a transformer with ONNX Runtime."""

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
    ) -> None:
        import onnxruntime as ort

        if precision not in ("fp32", "int8"):
            raise ModelError(
                f"runtime.precision: {precision!r} is not supported by onnxruntime; use fp32 or int8 "
                "(bf16 runs on the torch engine)"
            )
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ModelError(  # before the export: nothing built for a run that cannot start
                f"runtime.device = {device}: this onnxruntime ({ort.__version__}) has no CUDA provider "
                f"({', '.join(ort.get_available_providers())}); pip install onnxruntime-gpu, or set "
                "runtime.engine = torch"
            )
        entry = cache_entry(cache_dir, model_digest, precision, keep_fp32)
        self.fp32_path = cache_entry(cache_dir, model_digest, "fp32") / "model.onnx"
        self.cache_hit = (entry / "model.onnx").is_file()
        if not self.cache_hit:
            try:
                _build(model_dir, precision, entry, self.fp32_path.parent, keep_fp32)
            except (OSError, RuntimeError, ValueError) as exc:
                raise ModelError(f"{model_dir}: cannot export to ONNX ({type(exc).__name__}: {exc})") from exc
        self.path = entry / "model.onnx"
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if not spin:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if device.startswith("cuda"):
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)}))
        self._session = ort.InferenceSession(str(self.path), so, providers=providers)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = self._session.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]
        return np.asarray(out, dtype=np.float32)
