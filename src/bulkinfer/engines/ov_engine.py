"""The OpenVINO engine (CPU, fp32): the transformer's plain ONNX export (the same cache entry
ONNX Runtime builds without its fused contrib operators, which OpenVINO does not read), compiled
by OpenVINO for this CPU. OpenVINO keeps the compiled model in ``<key>/openvino`` beside the
ONNX file (its ``CACHE_DIR``), so a second load skips the compilation.

fp32 means fp32: OpenVINO runs bf16 by default on CPUs with AMX, and is told
``INFERENCE_PRECISION_HINT = f32`` here, so its embeddings are ONNX Runtime's and torch's
(a test holds them to sentence-transformers' at cosine 0.9999). int8 (NNCF) is not built yet.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ModelError
from .ort_engine import _build, cache_entry

__all__ = ["OpenVinoEngine"]

log = logging.getLogger("bulkinfer")


class OpenVinoEngine:
    """One compiled OpenVINO model, run one batch at a time."""

    def __init__(self, model_dir: str, *, threads: int, model_digest: str, cache_dir: Path) -> None:
        import openvino as ov  # the device and precision were checked by engines.load_engine

        entry = cache_entry(cache_dir, model_digest or model_dir, "fp32", fuse=False)
        if not (entry / "model.onnx").is_file():
            _build(model_dir, "fp32", entry, fuse=False)
        t0 = time.perf_counter()
        core = ov.Core()
        core.set_property({"CACHE_DIR": str(entry / "openvino")})
        config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": max(1, int(threads)),
                  "PERFORMANCE_HINT": "LATENCY"}  # fmt: skip
        try:
            self._compiled = core.compile_model(str(entry / "model.onnx"), "CPU", config)
        except RuntimeError as exc:
            raise ModelError(f"{model_dir}: OpenVINO cannot compile the exported model ({exc})") from exc
        self._request = self._compiled.create_infer_request()
        self._output = self._compiled.output(0)
        self.runs_on = f"openvino/CPU ({ov.__version__.split('-')[0]})"
        log.debug("openvino: compiled %s in %.1f s", entry, time.perf_counter() - t0)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        result: Any = self._request.infer({"input_ids": input_ids, "attention_mask": attention_mask})
        return np.asarray(result[self._output], dtype=np.float32)
