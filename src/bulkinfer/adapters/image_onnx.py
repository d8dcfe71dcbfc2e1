"""``model.kind = "image-onnx"``: any ONNX vision model, its preprocessing declared and its head
chosen in ``model.options``::

    [model]
    name = "detector.onnx"
    kind = "image-onnx"
    options = {head = "detect", size = 640, resize = "letterbox", labels = "labels.txt"}

Preprocessing (in the decode pool): resize to ``size`` (``resize``: stretch to it, or
``letterbox``: pad the bottom and right to a square with black, then resize, so the
picture keeps its shape), ``channels`` RGB or BGR, ``(pixel - mean) / std`` per channel on
the 0-255 scale (default: 0..1), ``layout`` NCHW or NHWC. Heads:

- ``classify``: ``label``, ``score`` and ``labels`` (the ``top_k`` best ``{label, score}``),
  after ``activation`` (softmax, sigmoid or none) over the first output;
- ``detect``: ``detections``, a list of ``{label, score, box}`` with ``box = [x, y, width,
  height]`` in the original picture's pixels, from a YOLOv8-style output (``N x (4 + classes)
  x anchors``: centre, size, class scores), class-agnostic non-maximum suppression;
- ``embed``: ``embedding``, the first output flattened per row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.errors import ConfigError, ModelError
from .image import ImageAdapter, stack
from .protocol import SetupContext

__all__ = ["DETECTIONS", "LABELS", "ImageOnnxAdapter", "VisionOptions"]

BOX = pa.list_(pa.int32())
DETECTIONS = pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64()), ("box", BOX)]))
"""A picture's detections: the ``detections`` column's type."""
LABELS = pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))


class VisionOptions(BaseModel):
    """``model.options`` of an image-onnx model (unknown keys refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head: Literal["classify", "detect", "embed"] = "classify"
    size: int | tuple[int, int] | None = None
    """Input height and width (one number: square); default: the model's own static input size."""
    resize: Literal["stretch", "letterbox"] = "stretch"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    channels: Literal["RGB", "BGR"] = "RGB"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (255.0, 255.0, 255.0)
    labels: str | list[str] | None = None
    """A labels file (one a line) or the list; default: class_0, class_1..."""
    top_k: int = Field(default=5, ge=1)
    activation: Literal["softmax", "sigmoid", "none"] = "softmax"
    score_threshold: float = Field(default=0.25, ge=0, le=1)
    iou_threshold: float = Field(default=0.45, ge=0, le=1)


def parse_options(options: dict[str, Any], where: str) -> VisionOptions:
    try:
        return VisionOptions.model_validate(options)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{where}.{field}: {first['msg']}") from None


_HEAD_COLUMNS = {"embed": ["embedding"], "classify": ["label", "score", "labels"], "detect": ["detections"]}


class ImageOnnxAdapter(ImageAdapter):
    """An ONNX vision model with declared preprocessing and a head (see the module)."""

    def __init__(
        self, model_path: str | Path, options: VisionOptions, *, engine: str = "onnxruntime", precision: str = "fp32",
        **image: Any,
    ) -> None:  # fmt: skip
        super().__init__(**image)
        self.model_path = Path(model_path)
        self.opts = options
        self.output_columns = _HEAD_COLUMNS[options.head]
        self.engine_name, self.precision = engine, precision
        self._session: Any = None
        self._compiled: Any = None
        self._labels = _read_labels(options.labels)
        self.size = self._size()

    def _size(self) -> tuple[int, int]:
        import onnxruntime as ort

        if self.opts.size is not None:
            return (self.opts.size, self.opts.size) if isinstance(self.opts.size, int) else tuple(self.opts.size)  # type: ignore[return-value]
        try:
            shape = ort.InferenceSession(str(self.model_path), providers=["CPUExecutionProvider"]).get_inputs()[0].shape
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"{self.model_path}: not a loadable ONNX model ({exc})") from exc
        h, w = (shape[2], shape[3]) if self.opts.layout == "NCHW" else (shape[1], shape[2])
        if not (isinstance(h, int) and isinstance(w, int)):
            raise ConfigError(f"model.options.size: {self.model_path.name} has no fixed input size; set size = [h, w]")
        return h, w

    def load(self, ctx: SetupContext) -> None:
        if self.engine_name == "openvino":
            self._load_openvino(ctx)
            return
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = ctx.threads
        # the decode pool needs the cores between calls: threads that spin for work take them
        # (measured: 56.1 against 54.1 photos/s over 600 NudeNet photos, three rounds each)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(self.model_path), so, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def prepare(self, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int, float, float]]:
        import cv2

        h, w = image.shape[:2]
        if self.opts.resize == "letterbox":
            side = max(h, w)
            image = cv2.copyMakeBorder(image, 0, side - h, 0, side - w, cv2.BORDER_CONSTANT, value=(0, 0, 0))
        sx, sy = image.shape[1] / self.size[1], image.shape[0] / self.size[0]
        pixels = cv2.resize(image, (self.size[1], self.size[0]), interpolation=cv2.INTER_LINEAR)
        if self.opts.channels == "BGR":
            pixels = pixels[:, :, ::-1]
        mean, std = np.asarray(self.opts.mean, np.float32), np.asarray(self.opts.std, np.float32)
        x = (pixels.astype(np.float32) - mean) * (np.float32(1.0) / std)
        tensor = np.ascontiguousarray(x.transpose(2, 0, 1) if self.opts.layout == "NCHW" else x, dtype=np.float32)
        return tensor, (w, h, sx, sy)

    def _load_openvino(self, ctx: SetupContext) -> None:
        """OpenVINO's CPU plugin, in fp32 or bf16 (its inference precision: weights and activations
        in bf16 where the CPU has bf16 instructions; the job's quality gate decides if it may run)."""
        try:
            import openvino as ov
        except ImportError as exc:
            raise ModelError("runtime.engine = openvino: pip install 'bulkinfer[openvino]'") from exc
        config = {
            "INFERENCE_PRECISION_HINT": "bf16" if self.precision == "bf16" else "f32",
            "INFERENCE_NUM_THREADS": ctx.threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        self._compiled = ov.Core().compile_model(str(self.model_path), "CPU", config)

    def factor(self, width: int, height: int) -> int:
        """The largest DCT reduction that keeps the picture at least the model's input size
        (letterbox: its long side against the input's; stretch: each side against its own)."""
        h_in, w_in = self.size
        for f in (8, 4, 2):
            if self.opts.resize == "letterbox" and max(width, height) // f >= max(h_in, w_in):
                return f
            if self.opts.resize == "stretch" and width // f >= w_in and height // f >= h_in:
                return f
        return 1

    def rescale(
        self, prepared: tuple[np.ndarray, tuple[int, int, float, float]], original: tuple[int, int],
        decoded: tuple[int, int],
    ) -> tuple[np.ndarray, tuple[int, int, float, float]]:  # fmt: skip
        tensor, (_w, _h, sx, sy) = prepared
        (w, h), (dw, dh) = original, decoded
        return tensor, (w, h, sx * w / dw, sy * h / dh)

    def run(self, batch: list[tuple[np.ndarray, Any]]) -> np.ndarray:
        x = stack([t for t, _ in batch])
        if self._compiled is not None:
            return np.asarray(self._compiled(x)[0])
        out: np.ndarray = self._session.run(None, {self._input: x})[0]
        return out

    def predict(self, batch: list[tuple[np.ndarray, Any]]) -> dict[str, Any]:
        out = self.run(batch)
        if self.opts.head == "embed":
            return {"embedding": out.reshape(len(batch), -1).astype(np.float32)}
        if self.opts.head == "classify":
            return self._classify(out.reshape(len(batch), -1))
        found = [self._detect(o, meta) for o, (_t, meta) in zip(out, batch, strict=True)]
        return {"detections": pa.array(found, DETECTIONS)}

    def _label(self, i: int) -> str:
        return self._labels[i] if i < len(self._labels) else f"class_{i}"

    def _classify(self, logits: np.ndarray) -> dict[str, Any]:
        scores = _activate(logits.astype(np.float64), self.opts.activation)
        k = min(self.opts.top_k, scores.shape[1])
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        top = [
            [{"label": self._label(int(j)), "score": float(row[j])} for j in idx]
            for row, idx in zip(scores, best, strict=True)
        ]
        return {
            "label": pa.array([t[0]["label"] for t in top], pa.string()),
            "score": pa.array([t[0]["score"] for t in top], pa.float64()),
            "labels": pa.array(top, LABELS),
        }

    def _detect(self, out: np.ndarray, meta: tuple[int, int, float, float]) -> list[dict[str, Any]]:
        return detect_boxes(out, meta, self.opts.score_threshold, self.opts.iou_threshold, self._label)


def detect_boxes(
    out: np.ndarray, meta: tuple[int, int, float, float], score_threshold: float, iou: float, label: Any
) -> list[dict[str, Any]]:
    """One picture's YOLOv8-style output (``(4 + classes) x anchors``) as detections in its own
    pixels: centre and size scaled back, clipped to the picture, class-agnostic NMS (OpenCV's)."""
    import cv2

    w_img, h_img, sx, sy = meta
    rows = np.asarray(out, dtype=np.float32).T
    scores = rows[:, 4:]
    best = scores.max(axis=1)
    keep = np.flatnonzero(best >= np.float32(score_threshold))
    if not len(keep):
        return []
    rows, best = rows[keep], best[keep]
    classes = scores[keep].argmax(axis=1)
    cx, cy, bw, bh = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    x = ((cx - bw / 2) * np.float32(sx)).clip(0, w_img)
    y = ((cy - bh / 2) * np.float32(sy)).clip(0, h_img)
    w = np.minimum(bw * np.float32(sx), np.float32(w_img) - x)
    h = np.minimum(bh * np.float32(sy), np.float32(h_img) - y)
    boxes = np.stack([x, y, w, h], axis=1)
    picked = cv2.dnn.NMSBoxes(boxes.tolist(), best.tolist(), score_threshold, iou)
    return [
        {"label": label(int(classes[i])), "score": float(best[i]), "box": [int(v) for v in boxes[i]]}
        for i in np.asarray(picked, dtype=np.int64).reshape(-1)
    ]


def _activate(x: np.ndarray, how: str) -> np.ndarray:
    if how == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return np.asarray(e / e.sum(axis=1, keepdims=True))
    if how == "sigmoid":
        return np.asarray(1.0 / (1.0 + np.exp(-x)))
    return x


def _read_labels(labels: str | list[str] | None) -> list[str]:
    if labels is None or isinstance(labels, list):
        return list(labels or [])
    path = Path(labels).expanduser()
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise ConfigError(f"model.options.labels: cannot read {path} ({exc.strerror or exc})") from None
