"""``--model ocr``: RapidOCR 1.4 (``rapidocr-onnxruntime``, which ships PP-OCRv4 detection,
the direction classifier and recognition), each picture through RapidOCR's own pipeline so
the text is RapidOCR's; its sessions use the job's threads, and the next pictures are decoded
while one is read. (Two pictures at once, each session on one thread, measured no faster on
2 cores: docs/images.md.) With OpenVINO installed (``runtime.engine`` auto or openvino), its
detection and recognition models run there in fp32, the same graphs (measured 1.8x ONNX
Runtime's time on 20 drawn pages, text and boxes identical).

Columns: ``lines``, a list of ``{text, score, box}`` (``box``: the line's four corners,
``[[x, y], ...]``, as RapidOCR gives them), and ``text``, the lines joined by newlines.
A picture RapidOCR finds no text in has no lines and an empty text.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ModelError
from .image import ImageAdapter
from .protocol import SetupContext

__all__ = ["LINES", "OcrAdapter"]

LINES = pa.list_(pa.struct([("text", pa.string()), ("score", pa.float64()), ("box", pa.list_(pa.list_(pa.float64())))]))
"""The ``lines`` column's type."""


class _OpenVino:
    """One of RapidOCR's models compiled by OpenVINO in fp32, called as RapidOCR calls its sessions."""

    def __init__(self, path: str, threads: int) -> None:
        import openvino as ov

        hints = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        self.model = ov.Core().compile_model(path, "CPU", hints)

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(self.model(x)[0])]


class OcrAdapter(ImageAdapter):
    """RapidOCR over batches of pictures (see the module)."""

    batch_size_hint = 4
    output_columns = ("lines", "text")

    def __init__(self, engine: str = "onnxruntime", **image: Any) -> None:
        super().__init__(**image)
        self.engine_name = engine
        self._engine: Any = None

    def load(self, ctx: SetupContext) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            raise ModelError(
                "model 'ocr': rapidocr-onnxruntime 1.4 is not installed; "
                "pip install --no-deps 'rapidocr-onnxruntime==1.4.4' (see docs/images.md)"
            ) from exc
        self._engine = RapidOCR(**{f"{part}_intra_op_num_threads": ctx.threads for part in ("det", "cls", "rec")})
        if self.engine_name == "openvino":  # the same fp32 graphs on OpenVINO's CPU plugin
            det, rec = self._engine.text_det, self._engine.text_rec
            det.infer = _OpenVino(det.infer.session._model_path, ctx.threads)
            rec.session = _OpenVino(rec.session.session._model_path, ctx.threads)

    def prepare(self, image: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(image[:, :, ::-1])  # BGR, as RapidOCR's loader makes of a file's RGB

    def _one(self, bgr: np.ndarray) -> list[dict[str, Any]]:
        result, _elapsed = self._engine(bgr)
        return [
            {"text": text, "score": float(score), "box": [[float(x), float(y)] for x, y in box]}
            for box, text, score in (result or [])
        ]

    def predict(self, batch: list[np.ndarray]) -> dict[str, Any]:
        lines = [self._one(bgr) for bgr in batch]
        return {"lines": pa.array(lines, LINES), "text": pa.array(["\n".join(ln["text"] for ln in r) for r in lines])}
