"""``--model ocr``: RapidOCR 1.4 (``rapidocr-onnxruntime``, which ships PP-OCRv4 detection,
the direction classifier and recognition), each picture through RapidOCR's own pipeline so
the text is RapidOCR's, several pictures at once on the cores (each ONNX Runtime session on
one thread: OCR's many small calls keep a second thread of one call waiting).

Columns: ``lines``, a list of ``{text, score, box}`` (``box``: the line's four corners,
``[[x, y], ...]``, as RapidOCR gives them), and ``text``, the lines joined by newlines.
A picture RapidOCR finds no text in has no lines and an empty text.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ModelError
from .base import SetupContext
from .image import ImageAdapter

__all__ = ["LINES", "OcrAdapter"]

LINES = pa.list_(pa.struct([("text", pa.string()), ("score", pa.float64()), ("box", pa.list_(pa.list_(pa.float64())))]))
"""The ``lines`` column's type."""


class OcrAdapter(ImageAdapter):
    """RapidOCR over batches of pictures (see the module)."""

    batch_size_hint = 4

    def __init__(self, **image: Any) -> None:
        super().__init__(**image)
        self._engine: Any = None
        self._calls: ThreadPoolExecutor | None = None

    def load(self, ctx: SetupContext) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            raise ModelError(
                "model 'ocr': rapidocr-onnxruntime 1.4 is not installed; "
                "pip install --no-deps 'rapidocr-onnxruntime==1.4.4' (see docs/images.md)"
            ) from exc
        one = {f"{part}_intra_op_num_threads": 1 for part in ("det", "cls", "rec")}
        self._engine = RapidOCR(**one)
        self._calls = ThreadPoolExecutor(max_workers=max(1, ctx.threads), thread_name_prefix="bulkinfer-ocr")

    def prepare(self, image: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(image[:, :, ::-1])  # BGR, as RapidOCR's loader makes of a file's RGB

    def _one(self, bgr: np.ndarray) -> list[dict[str, Any]]:
        result, _elapsed = self._engine(bgr)
        return [
            {"text": text, "score": float(score), "box": [[float(x), float(y)] for x, y in box]}
            for box, text, score in (result or [])
        ]

    def predict(self, batch: list[np.ndarray]) -> dict[str, Any]:
        assert self._calls is not None
        lines = list(self._calls.map(self._one, batch))
        return {"lines": pa.array(lines, LINES), "text": pa.array(["\n".join(ln["text"] for ln in r) for r in lines])}

    def close(self) -> None:
        super().close()
        if self._calls is not None:
            self._calls.shutdown(wait=False)
