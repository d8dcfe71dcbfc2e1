"""Picture models chosen by a job: the packaged ones by short name (``nudenet``, ``ocr``),
``image-onnx`` with its declared options, and a custom :class:`~.image.ImageAdapter` given the
job's picture settings."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from ..config import JobConfig
from ..core.errors import ConfigError, ModelError
from ..core.hardware import emulated
from .decode import Reduced
from .digest import digest_path
from .image import ImageAdapter
from .protocol import Adapter

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
        "decode": cfg.source.decode,
    }


def _engine(cfg: JobConfig, kind: str) -> dict[str, str]:
    """The engine and precision of an ONNX picture model: fp32 on ONNX Runtime (or OpenVINO when
    asked), bf16 on OpenVINO where the CPU has bf16 instructions; anything else refused."""
    rt = cfg.runtime
    if rt.device != "cpu" or rt.tensorrt:
        raise ConfigError(
            f"runtime.device = {rt.device}{' with tensorrt' if rt.tensorrt else ''}: picture models run on the CPU "
            "(ONNX Runtime's or OpenVINO's CPU plugin); leave runtime.device and runtime.tensorrt unset"
        )
    if rt.precision not in ("fp32", "bf16") or (kind == "ocr" and rt.precision != "fp32"):
        allowed = "fp32" if kind == "ocr" else "fp32 or bf16 (OpenVINO, gated)"
        raise ConfigError(f"runtime.precision: {rt.precision} is not built for picture model {kind!r}; use {allowed}")
    if rt.engine not in ("auto", "onnxruntime", "openvino"):
        raise ConfigError(f"runtime.engine: {rt.engine} does not run picture model {kind!r}; use onnxruntime")
    if kind == "ocr":  # auto: OpenVINO where it is installed (the same fp32 graphs, faster here)
        auto = "openvino" if importlib.util.find_spec("openvino") is not None else "onnxruntime"
        return {"engine": auto if rt.engine == "auto" else rt.engine}
    if rt.precision == "bf16":
        if rt.engine == "onnxruntime":
            raise ConfigError("runtime.precision = bf16: picture models run bf16 on openvino; set runtime.engine")
        if rt.device != "cpu" or emulated("cpu", "bf16"):
            raise ConfigError(
                "runtime.precision = bf16: this CPU has no bf16 instructions (AVX-512 bf16 or AMX): "
                "it would run in fp32, slower; use fp32"
            )
        return {"engine": "openvino", "precision": "bf16"}
    return {"engine": "openvino" if rt.engine == "openvino" else "onnxruntime", "precision": "fp32"}


def vision_adapter(cfg: JobConfig, kind: str, location: str) -> Adapter:
    """The adapter of a picture model (``kind``: nudenet, ocr or image-onnx; ``location``: its file)."""
    image = _image_settings(cfg)
    engine = _engine(cfg, kind)
    if kind == "nudenet":
        from .nudenet import NudeNetAdapter

        if cfg.model.options:
            raise ModelError("model.options: NudeNet takes none (its preprocessing is its own); drop them")
        return NudeNetAdapter(**engine, **image)
    if kind == "ocr":
        from .ocr import OcrAdapter

        if cfg.model.options:
            raise ModelError("model.options: the OCR model takes none; drop them")
        if cfg.source.decode != "exact":
            raise ConfigError('source.decode = "reduced": OCR reads every pixel of a page; use "exact"')
        return OcrAdapter(**engine, **image)
    from .image_onnx import ImageOnnxAdapter, parse_options

    return ImageOnnxAdapter(location, parse_options(dict(cfg.model.options), "model.options"), **engine, **image)


def fit_image_adapter(adapter: Adapter, cfg: JobConfig) -> Adapter:
    """A custom picture adapter takes the job's picture limits and id column (its own
    ``image_column`` option wins over ``model.image_column``)."""
    if isinstance(adapter, ImageAdapter):
        settings = _image_settings(cfg)
        if settings["decode"] != "exact" and not isinstance(adapter, Reduced):
            raise ConfigError(
                f'source.decode = "reduced": {type(adapter).__name__} says no size it may be decoded at; '
                'give it factor() and rescale() (bulkinfer.adapters.decode.Reduced), or use "exact"'
            )
        if "image_column" in cfg.model.options:
            settings.pop("image_column")
        else:
            adapter.input_columns = [settings["image_column"]]
        for key, value in settings.items():
            setattr(adapter, key, value)
    return adapter
