"""Picture models chosen by a job: the packaged ones by short name (``nudenet``, ``ocr``),
``image-onnx`` with its declared options, and a custom :class:`~.image.ImageAdapter` given the
job's picture settings."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from ..config import JobConfig
from ..core.errors import ModelError
from .base import Adapter
from .digest import digest_path
from .image import ImageAdapter

__all__ = ["fit_image_adapter", "packaged_model", "vision_adapter"]


def _ocr_models() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "model 'ocr': rapidocr-onnxruntime is not installed; "
            "pip install --no-deps 'rapidocr-onnxruntime==1.4.4' (its requirements come with bulkinfer[images])"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "models"


def packaged_model(name: str) -> tuple[str, str, str]:
    """``nudenet`` or ``ocr`` (``rapidocr``): its kind, where its weights are and their digest."""
    from .nudenet import nudenet_model

    if name == "nudenet":
        path = nudenet_model()
        return "nudenet", str(path), digest_path(path)
    models = _ocr_models()
    digest = hashlib.sha256("".join(digest_path(p) for p in sorted(models.glob("*.onnx"))).encode())
    return "ocr", str(models), digest.hexdigest()[:32]


def _image_settings(cfg: JobConfig) -> dict[str, Any]:
    return {
        "image_column": cfg.model.image_column,
        "id_column": cfg.source.id_column,
        "max_pixels": cfg.source.max_image_pixels,
        "max_decoded_mb": cfg.source.max_decoded_mb,
    }


def vision_adapter(cfg: JobConfig, kind: str, location: str) -> Adapter:
    """The adapter of a picture model (``kind``: nudenet, ocr or image-onnx; ``location``: its file)."""
    image = _image_settings(cfg)
    if kind == "nudenet":
        from .nudenet import NudeNetAdapter

        if cfg.model.options:
            raise ModelError("model.options: NudeNet takes none (its preprocessing is its own); drop them")
        return NudeNetAdapter(**image)
    if kind == "ocr":
        from .ocr import OcrAdapter

        if cfg.model.options:
            raise ModelError("model.options: the OCR model takes none; drop them")
        return OcrAdapter(**image)
    from .image_onnx import ImageOnnxAdapter, parse_options

    return ImageOnnxAdapter(location, parse_options(dict(cfg.model.options), "model.options"), **image)


def fit_image_adapter(adapter: Adapter, cfg: JobConfig) -> Adapter:
    """A custom picture adapter takes the job's picture limits and id column (its own
    ``image_column`` option wins over ``model.image_column``)."""
    if isinstance(adapter, ImageAdapter):
        settings = _image_settings(cfg)
        if "image_column" in cfg.model.options:
            settings.pop("image_column")
        else:
            adapter.input_columns = [settings["image_column"]]
        for key, value in settings.items():
            setattr(adapter, key, value)
    return adapter
