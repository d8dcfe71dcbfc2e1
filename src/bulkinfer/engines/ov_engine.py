"""The OpenVINO engine (CPU; fp32 and int8): the transformer's plain ONNX export (the same cache
entry ONNX Runtime builds without its fused contrib operators, which OpenVINO does not read),
compiled by OpenVINO for this CPU. OpenVINO keeps the compiled model in ``<key>/openvino`` beside
the ONNX file (its ``CACHE_DIR``), so a second load skips the compilation.

fp32 means fp32: OpenVINO runs bf16 by default on CPUs with AMX, and is told
``INFERENCE_PRECISION_HINT = f32`` here, so its embeddings are ONNX Runtime's and torch's
(a test holds them to sentence-transformers' at cosine 0.9999).

int8 is NNCF's weight compression (``INT8_SYM``, per output channel: data-free, nothing to
calibrate) run with the CPU plugin's dynamic quantization of activations in groups of
``INT8_GROUP`` values, so the matrix products run on int8 kernels. On the bundled MiniLM it
stays closer to fp32 (mean cosine about 0.999) than ONNX Runtime's dynamic int8 (about 0.992)
at a similar speed; NNCF's static transformer preset was measured too (docs/precision.md) and is
not built: it needs calibration rows, was no faster, and farther from fp32. The compressed model
is kept as OpenVINO IR in ``<key>/openvino-int8-<versions>``, compiled models beside it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ModelError
from .ort_engine import build_entry, cache_entry

__all__ = ["INT8_GROUP", "OpenVinoEngine"]

log = logging.getLogger("bulkinfer")

INT8_GROUP = 64
"""Activations are quantized per group of this many values (OpenVINO's
``DYNAMIC_QUANTIZATION_GROUP_SIZE``); 64 measured fastest on MiniLM against 32, 128 and a row."""


def _int8_dir(entry: Path) -> Path:
    """The compressed model's folder: keyed by the versions that made it (the entry's key has
    the exporting libraries', not OpenVINO's or NNCF's)."""
    made_by = []
    for name in ("openvino", "nncf"):
        try:
            made_by.append(version(name).split("-")[0])
        except PackageNotFoundError:
            made_by.append("none")
    return entry / f"openvino-int8-{'-'.join(made_by)}"


def _compress(onnx_path: Path, out: Path) -> float:
    """NNCF's int8 weight compression of ``onnx_path`` into ``out`` (IR, built aside then renamed
    into place); seconds taken."""
    try:
        import nncf
    except ImportError as exc:
        raise ModelError(
            f"runtime.precision = int8 on openvino needs nncf ({exc}); pip install 'bulkinfer[openvino]', "
            "or use runtime.engine = onnxruntime"
        ) from exc
    import openvino as ov

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    # its progress bar (rich, on stdout) and tables (its logger) are not bulkinfer's output; the
    # logger's level only (nncf.set_log_level also sets every handler's level, other libraries' included)
    chatter = logging.getLogger("nncf")
    level = chatter.level
    chatter.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = nncf.compress_weights(ov.Core().read_model(str(onnx_path)), mode=nncf.CompressWeightsMode.INT8_SYM)
        ov.save_model(model, str(work / "model.xml"), compress_to_fp16=False)
        try:
            os.rename(work, out)
        except OSError:  # another job compressed it first: use theirs
            if not (out / "model.xml").is_file():
                raise
    finally:
        chatter.setLevel(level)
        shutil.rmtree(work, ignore_errors=True)
    return time.perf_counter() - t0


class OpenVinoEngine:
    """One compiled OpenVINO model, run one batch at a time."""

    def __init__(
        self, model_dir: str, *, threads: int, model_digest: str, cache_dir: Path, precision: str = "fp32"
    ) -> None:
        import openvino as ov  # the device and precision were checked by engines.load_engine

        entry = cache_entry(cache_dir, model_digest or model_dir, "fp32", fuse=False)
        self.build_split: dict[str, float] = {}  # seconds of this load's export and int8 build (none: cached)
        if not (entry / "model.onnx").is_file():
            t0 = time.perf_counter()
            build_entry(model_dir, "fp32", entry, fuse=False)
            self.build_split["export_s"] = time.perf_counter() - t0
        source, compiled = entry / "model.onnx", entry / "openvino"
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": max(1, int(threads)),
                                  "PERFORMANCE_HINT": "LATENCY"}  # fmt: skip
        if precision == "int8":
            folder = _int8_dir(entry)
            if not (folder / "model.xml").is_file():
                self.build_split["build_s"] = _compress(source, folder)
            source, compiled = folder / "model.xml", folder / "compiled"
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = INT8_GROUP
        t0 = time.perf_counter()
        core = ov.Core()
        core.set_property({"CACHE_DIR": str(compiled)})
        try:
            self._compiled = core.compile_model(str(source), "CPU", config)
        except RuntimeError as exc:
            raise ModelError(f"{model_dir}: OpenVINO cannot compile the exported model ({exc})") from exc
        self._request = self._compiled.create_infer_request()
        self._output = self._compiled.output(0)
        self.runs_on = f"openvino/CPU ({ov.__version__.split('-')[0]})"
        log.debug("openvino: compiled %s in %.1f s", source, time.perf_counter() - t0)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        result: Any = self._request.infer({"input_ids": input_ids, "attention_mask": attention_mask})
        return np.asarray(result[self._output], dtype=np.float32)
