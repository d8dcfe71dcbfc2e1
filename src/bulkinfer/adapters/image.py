"""The base of picture models: :meth:`ImageAdapter.preprocess` decodes a window's pictures in
the decode pool (:mod:`.decode`), each handed to :meth:`ImageAdapter.prepare`; ``predict``
gets a list of what ``prepare`` returned, one per row.

Your own picture model subclasses it and overrides ``predict`` (and ``prepare`` to resize or
normalise in the pool); by default ``prepare`` hands on the decoded picture itself, an
``H x W x 3`` uint8 RGB array::

    class Brightness(ImageAdapter):
        def predict(self, images):
            return {"brightness": [float(im.mean()) for im in images]}
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ModelError
from .decode import BadImage, DecodePool, Reduced
from .protocol import Adapter, RowsRejected, SetupContext

__all__ = ["DEFAULT_BUDGET_MB", "ImageAdapter"]

DEFAULT_BUDGET_MB = 512
"""``source.max_decoded_mb``' default: decoded pictures in flight at once."""


class ImageAdapter(Adapter):
    """Decodes the picture column beside inference; subclasses run the model (see the module)."""

    batch_size_hint = 16
    window_rows = 64
    """Pictures read and decoded ahead together (not ``runtime.sort_window``'s 2,048 text rows):
    the decoded window is what waits for the model, so it is kept a few batches deep."""

    def __init__(
        self,
        image_column: str = "image",
        id_column: str | None = None,
        max_pixels: int | None = 89_478_485,
        max_decoded_mb: int = DEFAULT_BUDGET_MB,
        decode: str = "exact",
    ) -> None:
        self.image_column = self.picture_column = image_column
        self.decode = decode
        self.id_column = id_column
        self.input_columns = [image_column]
        self.max_pixels = max_pixels
        self.max_decoded_mb = max_decoded_mb
        self.pool: DecodePool | None = None
        self._kept = threading.local()  # rows prepared before a rejection, taken again by their bytes

    def setup(self, ctx: SetupContext) -> None:
        reduced = self if self.decode == "reduced" and isinstance(self, Reduced) else None
        self.pool = DecodePool(ctx.threads, self.max_pixels, self.max_decoded_mb << 20, reduced)
        self.load(ctx)

    def load(self, ctx: SetupContext) -> None:
        """Load the model (once per worker, after the decode pool is up)."""

    def prepare(self, image: np.ndarray) -> Any:
        """One decoded picture (``H x W x 3`` uint8 RGB) as the model's input; runs in the pool."""
        return image

    def picture_inputs(self, table: pa.Table) -> tuple[list[bytes | str], list[str]]:
        """Each row's picture (bytes, or a path/URI) and how an error names the row."""
        if self.image_column not in table.column_names:
            raise ModelError(f"the picture column {self.image_column!r} is not in the input; set model.image_column")
        column = table.column(self.image_column)
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type) or _is_text(column.type)):
            raise ModelError(
                f"the picture column {self.image_column!r} is {column.type}; it must hold a picture's bytes or its path"
            )
        return [v or b"" for v in column.to_pylist()], self._names(table)

    def preprocess(self, table: pa.Table) -> list[Any]:
        if self.pool is None:
            raise ModelError(f"{type(self).__name__}: preprocess before setup; call setup(ctx) first")
        values, names = self.picture_inputs(table)
        kept: dict[bytes, Any] = getattr(self._kept, "rows", {})
        keys = [_key(v) for v in values] if kept else []
        todo = [i for i in range(len(values)) if not kept or keys[i] not in kept]
        done = self.pool.run([values[i] for i in todo], [names[i] for i in todo], self.prepare)
        out: list[Any] = [kept.get(k) for k in keys] if kept else [None] * len(values)
        for i, result in zip(todo, done, strict=True):
            out[i] = result
        self._kept.rows = {}
        bad = {i: r for i, r in enumerate(out) if isinstance(r, BadImage)}
        if bad:  # the good rows are kept: the runner asks for them again, and they are not decoded twice
            keys = keys or [_key(v) for v in values]
            self._kept.rows = {keys[i]: r for i, r in enumerate(out) if i not in bad}
            raise RowsRejected(bad)
        return out

    def _names(self, table: pa.Table) -> list[str]:
        """How an error names each row: its id, else its path, else its place in the window."""
        for column in (self.id_column, "id", "path"):
            if column and column in table.column_names:
                return [str(v) for v in table.column(column).to_pylist()]
        return [f"row {i} of the window" for i in range(table.num_rows)]

    def take_figures(self) -> dict[str, Any]:
        new = self.pool.take_decoded() if self.pool is not None else 0
        return {"pictures_decoded": new} if new else {}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _key(value: Any) -> bytes:
    data = value.encode() if isinstance(value, str) else value or b""
    return hashlib.blake2b(data, digest_size=16).digest()


def stack(items: Sequence[np.ndarray]) -> np.ndarray:
    """One batch array of the rows' equal-shape inputs."""
    return np.ascontiguousarray(np.stack(items))
