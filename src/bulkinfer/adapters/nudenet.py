"""``--model nudenet``: NudeNet's detector (the ``nudenet`` package ships its weights,
``320n.onnx``), run batched on ONNX Runtime with NudeNet's own preprocessing and decoding: the
picture padded at the bottom and right to a square, resized to 320, BGR, scaled to 0..1; boxes
above 0.25, class-agnostic NMS at IoU 0.45, each ``[x, y, width, height]`` in the original
picture's pixels, as ``NudeDetector.detect`` answers (its ``class`` is our ``label``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ..core.errors import ModelError
from .image_onnx import ImageOnnxAdapter, VisionOptions

__all__ = ["NUDENET_LABELS", "NudeNetAdapter", "nudenet_model"]

NUDENET_LABELS = [
    "FEMALE_GENITALIA_COVERED", "FACE_FEMALE", "BUTTOCKS_EXPOSED", "FEMALE_BREAST_EXPOSED", "FEMALE_GENITALIA_EXPOSED",
    "MALE_BREAST_EXPOSED", "ANUS_EXPOSED", "FEET_EXPOSED", "BELLY_COVERED", "FEET_COVERED", "ARMPITS_COVERED",
    "ARMPITS_EXPOSED", "FACE_MALE", "BELLY_EXPOSED", "MALE_GENITALIA_EXPOSED", "ANUS_COVERED", "FEMALE_BREAST_COVERED",
    "BUTTOCKS_COVERED",
]  # fmt: skip
"""NudeNet 3.4's classes, in its model's output order."""

OPTIONS = VisionOptions(
    head="detect", size=320, resize="letterbox", channels="BGR", labels=NUDENET_LABELS,
    score_threshold=0.25, iou_threshold=0.45,
)  # fmt: skip


def nudenet_model() -> Path:
    """The detector's weights inside the installed ``nudenet`` package (nothing imported)."""
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("model 'nudenet': the nudenet package is not installed; pip install 'bulkinfer[images]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "320n.onnx"
    if not path.is_file():
        raise ModelError(f"model 'nudenet': {path} is missing; reinstall nudenet==3.4.2")
    return path


class NudeNetAdapter(ImageOnnxAdapter):
    """NudeNet's detector, batched (see the module)."""

    batch_size_hint = 8

    def __init__(self, **settings: Any) -> None:
        super().__init__(nudenet_model(), OPTIONS, **settings)
