"""A model run over tiles with a halo (a Zarr or NetCDF source, :mod:`bulkinfer.sources.grids`):
its answers lose the halo again. An output whose trailing axes have the padded tile's sizes is
cut to the tile's own cells on each haloed axis; any other output (a per-tile figure, a label)
is kept as it is. The tile's axes are told by the ``tile`` column's ``dim_names``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from .protocol import Adapter, Wrapped

__all__ = ["Cropped", "crop"]


def crop(values: Any, padded: tuple[int, ...], halos: tuple[int, ...]) -> Any:
    """``values`` with ``halos[i]`` cells cut each side of its trailing axis ``i`` when those
    axes are ``padded`` (the tile's sizes, halo included); anything else as it is."""
    k = len(padded)
    if not isinstance(values, np.ndarray) or values.ndim < 1 + k or tuple(values.shape[-k:]) != padded:
        return values
    cut: tuple[Any, ...] = (Ellipsis, *(slice(h, n - h) for n, h in zip(padded, halos, strict=True)))
    return values[cut]


class Cropped(Wrapped):
    """``inner`` over the ``column`` of tiles, its answers cut by ``halo`` (cells per dimension)."""

    def __init__(self, inner: Adapter, halo: Mapping[str, int], column: str = "tile") -> None:
        super().__init__(inner)
        self.halo, self.column = dict(halo), column
        self._padded: tuple[int, ...] = ()
        self._halos: tuple[int, ...] = ()

    def preprocess(self, table: pa.Table) -> Any:
        kind = table.schema.field(self.column).type if self.column in table.column_names else None
        if isinstance(kind, pa.FixedShapeTensorType) and kind.dim_names:
            self._padded = tuple(kind.shape[1:])
            self._halos = tuple(self.halo.get(name, 0) for name in kind.dim_names[1:])
        return self.inner.preprocess(table)

    def postprocess(self, outputs: Any) -> Mapping[str, Any]:
        columns = self.inner.postprocess(outputs)
        if not any(self._halos):
            return columns
        return {name: crop(values, self._padded, self._halos) for name, values in columns.items()}
