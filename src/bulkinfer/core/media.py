"""What pictures and videos are named (config's format detection and the listings share the
extensions), and a video frame's raw form in a picture column."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "from_raw_frame",
    "labels_in",
    "looks_like_images",
    "looks_like_tars",
    "looks_like_videos",
    "raw_frame",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
"""What a folder's pictures are named (case aside); a glob's matches are taken whatever their names."""


def looks_like_images(path: str) -> bool:
    """Whether a path or glob names pictures by its extension (``photos/*.jpg``)."""
    return path.lower().rstrip("/").endswith(IMAGE_EXTENSIONS)


def looks_like_tars(path: str) -> bool:
    """Whether a path or glob names tar files (WebDataset shards: ``shards/*.tar``)."""
    return path.lower().rstrip("/").endswith(".tar")


VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v")
"""What videos are named (case aside): a path or glob ending so is read as video frames."""

_RAW = b"\x00bulkinfer-rgb24\x00"


def looks_like_videos(path: str) -> bool:
    """Whether a path or glob names videos by its extension (``clips/*.mp4``)."""
    return path.lower().rstrip("/").endswith(VIDEO_EXTENSIONS)


def raw_frame(rgb: np.ndarray) -> bytes:
    """A decoded frame (``H x W x 3`` uint8 RGB) as a picture column's bytes: a marker, its
    height and width, its pixels; the decode pool takes it back without decoding."""
    h, w = rgb.shape[:2]
    return _RAW + struct.pack("<II", h, w) + np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()


def from_raw_frame(data: bytes) -> np.ndarray | None:
    """The frame :func:`raw_frame` wrote, or None for any other bytes (an encoded picture)."""
    if not data.startswith(_RAW):
        return None
    h, w = struct.unpack_from("<II", data, len(_RAW))
    return np.frombuffer(data, np.uint8, offset=len(_RAW) + 8).reshape(h, w, 3)


def labels_in(row: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """Every (label, score) an output row of a picture model holds: lists of {label, score}
    (detections, top-k labels) and a scalar label with its score."""
    for value in row.values():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and item.get("label") is not None and item.get("score") is not None:
                    yield str(item["label"]), float(item["score"])
    if isinstance(row.get("label"), str) and isinstance(row.get("score"), int | float):
        yield row["label"], float(row["score"])
