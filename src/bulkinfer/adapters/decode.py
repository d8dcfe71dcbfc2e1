"""Pictures decoded beside inference: a pool of threads sized to the cores turns each row's
bytes (or path) into the model's input, under a budget on decoded bytes in flight.

Each picture is opened (its header only), refused when it has more pixels than
``source.max_image_pixels`` (a decompression bomb), then waits until its decoded size fits the
budget (``source.max_decoded_mb``; a picture larger than the whole budget waits for the pool to
be empty and goes alone), is decoded, turned upright by its EXIF orientation, converted to
8-bit RGB and handed to the model's ``prepare`` (resize, letterbox, normalise), after which
its decoded pixels are let go. Pillow and OpenCV release the interpreter while they work, so
the threads decode side by side while the model runs.

Conversions (documented in docs/images.md): palette, greyscale, 1-bit and CMYK pictures
become RGB (Pillow's conversions); an alpha channel is dropped (the colour under it is kept,
as OpenCV's ``imread`` and torchvision's loaders do); 16-bit greyscale is scaled to 8 bits
(``value >> 8``), not clipped; a GIF or multi-page TIFF gives its first frame.

A picture that cannot be decoded (truncated, empty, not a picture, over the pixel limit) is
a :class:`BadImage` naming the row's id and why: one error row, never a failed batch.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..core.media import from_raw_frame
from ..core.threads import pool

__all__ = ["BadImage", "DecodeBudget", "DecodePool", "Reduced", "decode_rgb", "open_image", "upright_size"]


@runtime_checkable
class Reduced(Protocol):
    """A model that may be given its JPEGs decoded smaller (``source.decode = "reduced"``)."""

    def factor(self, width: int, height: int) -> int:
        """1, 2, 4 or 8: how much smaller a picture of this size may be decoded for the model."""
        ...

    def rescale(self, prepared: Any, original: tuple[int, int], decoded: tuple[int, int]) -> Any:
        """What ``prepare`` made of the smaller picture, its geometry put back in the original's pixels."""
        ...


class BadImage(ValueError):
    """A row's picture cannot be decoded; the message names the row and says why."""


class DecodeBudget:
    """Decoded bytes in flight, at most ``limit``: ``take`` waits until ``n`` more fit (or nothing
    is in flight: one picture larger than the budget goes alone)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.peak = limit, 0, 0
        self._cond = threading.Condition()

    def take(self, n: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n
            self.peak = max(self.peak, self.used)

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


def open_image(data: bytes, name: str, max_pixels: int | None) -> Any:
    """The picture's header (nothing decoded yet), refused past ``max_pixels``."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    if not data:
        raise BadImage(f"{name}: the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our limit is the one that counts
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise BadImage(f"{name}: not a picture Pillow can read (JPEG, PNG, WebP, GIF, BMP, TIFF)") from None
    except Image.DecompressionBombError as exc:
        raise BadImage(f"{name}: {exc}; raise source.max_image_pixels to decode it") from None
    except (OSError, ValueError, SyntaxError) as exc:  # a header cut short
        raise BadImage(f"{name}: cannot decode the picture ({exc})") from None
    w, h = img.size
    if max_pixels is not None and w * h > max_pixels:
        raise BadImage(
            f"{name}: {w}x{h} = {w * h} pixels, over source.max_image_pixels ({max_pixels}); "
            "a decompression bomb or a picture too large: raise the limit to decode it"
        )
    return img


def decode_rgb(img: Any, name: str, data: bytes | None = None, reduce: int = 1) -> np.ndarray:
    """The opened picture decoded: upright by its EXIF orientation, 8-bit RGB, HWC. A colour or
    grey JPEG whose bytes are given is decoded by OpenCV (libjpeg-turbo, about 3x Pillow's time
    here, EXIF applied the same; docs/images.md), at 1/``reduce`` of its size (2, 4 or 8: the
    DCT scaled as it is decoded) when asked; anything else by Pillow, at full size."""
    from PIL import ImageOps

    if data is not None and img.format == "JPEG" and img.mode in ("RGB", "L"):
        decoded = _jpeg(data, reduce)
        if decoded is not None:
            return decoded
    try:
        img.load()
        upright = ImageOps.exif_transpose(img)
        if upright.mode in ("I;16", "I;16B", "I;16L", "I"):
            grey = (np.asarray(upright, dtype=np.uint32) >> 8).clip(0, 255).astype(np.uint8)
            return np.repeat(grey[:, :, None], 3, axis=2)
        return np.asarray(upright if upright.mode == "RGB" else upright.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's words for a broken file
        raise BadImage(f"{name}: cannot decode the picture ({exc})") from None


_REDUCED = {1: "IMREAD_COLOR", 2: "IMREAD_REDUCED_COLOR_2", 4: "IMREAD_REDUCED_COLOR_4", 8: "IMREAD_REDUCED_COLOR_8"}


def upright_size(img: Any) -> tuple[int, int]:
    """The picture's width and height once its EXIF orientation is applied."""
    w, h = img.size
    try:
        turned = img.getexif().get(0x0112) in (5, 6, 7, 8)
    except Exception:  # an unreadable EXIF block: Pillow's own transpose will ignore it too
        turned = False
    return (h, w) if turned else (w, h)


def _jpeg(data: bytes, reduce: int = 1) -> np.ndarray | None:
    """A JPEG decoded by OpenCV as RGB (upright by its EXIF orientation); None where it fails or
    the file is cut short (Pillow then decodes it, and names what is wrong)."""
    import cv2

    if not data.rstrip(b"\0").endswith(b"\xff\xd9"):  # no end-of-image marker: cut short (OpenCV would pad it grey)
        return None
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), getattr(cv2, _REDUCED[reduce]))
    if bgr is None:
        return None
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _read(uri: str, name: str) -> bytes:
    from ..core.storage import open_binary

    try:
        with open_binary(uri) as f:
            data: bytes = f.read()
    except OSError as exc:
        raise BadImage(f"{name}: cannot read {uri} ({exc.strerror or exc})") from None
    return data


class DecodePool:
    """Threads that decode and prepare pictures; ``run`` keeps the rows' order and returns, for
    each row, what ``prepare`` made of it or the :class:`BadImage` it met."""

    def __init__(self, threads: int, max_pixels: int | None, budget_bytes: int, reduced: Reduced | None = None) -> None:
        self.max_pixels = max_pixels
        self.reduced: Reduced | None = reduced
        """The model, when its JPEGs may be decoded smaller (``source.decode = "reduced"``)."""
        self.budget = DecodeBudget(budget_bytes)
        self._pool = pool(max(1, threads), "bulkinfer-decode")
        self.decoded = 0
        """Pictures decoded so far (report.json's ``pictures_decoded``)."""
        self._told = 0
        self._count = threading.Lock()

    def one(self, data: bytes | str, name: str, prepare: Callable[[np.ndarray], Any]) -> Any:
        if isinstance(data, str):  # a path or URI column: read here, in the pool
            data = _read(data, name)
        frame = from_raw_frame(data)
        if frame is not None:  # a video frame, decoded by its reader
            return prepare(frame)
        img = open_image(data, name, self.max_pixels)
        w, h = upright_size(img)
        factor = self.reduced.factor(w, h) if self.reduced is not None and img.format == "JPEG" else 1
        size = -(-w // factor) * -(-h // factor) * 3
        self.budget.take(size)
        try:
            image = decode_rgb(img, name, data, factor)
            with self._count:
                self.decoded += 1
            if self.reduced is None or factor == 1 or image.shape[:2] == (h, w):
                return prepare(image)
            return self.reduced.rescale(prepare(image), (w, h), (image.shape[1], image.shape[0]))
        finally:
            self.budget.give(size)

    def run(
        self, images: Sequence[bytes | str], names: Sequence[str], prepare: Callable[[np.ndarray], Any]
    ) -> list[Any]:
        def task(i: int) -> Any:
            try:
                return self.one(images[i], names[i], prepare)
            except BadImage as exc:
                return exc
            except Exception as exc:  # the model's preparation failed on this picture alone
                return BadImage(f"{names[i]}: cannot prepare the picture ({type(exc).__name__}: {exc})")

        return list(self._pool.map(task, range(len(images))))

    def take_decoded(self) -> int:
        """Pictures decoded since the last call (what a run's figures have not counted yet)."""
        with self._count:
            new, self._told = self.decoded - self._told, self.decoded
        return new

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
