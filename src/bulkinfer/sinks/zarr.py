"""The array output of a grid job (``sink.format = "zarr"``): ``<output>/array.zarr``, written
region by region as each shard commits.

Every tensor column of the answer (a ``fixed_shape_tensor``: the model's per-tile arrays, the
halo already cut) becomes one array over the input grid's dimensions (leading axes of its own,
``<column>_0``..., first), chunked exactly as the input is tiled, so each tile is one chunk and
two shards never write the same chunk. A shard's tiles are written before its ledger line, so
a shard killed mid-write is written again whole on resume, the same values into the same
chunks; a region the ledger says is done is never written again. The input's coordinates and
attributes are carried over, with the model's identity (``bulkinfer_model``,
``bulkinfer_model_digest``, ``bulkinfer_job``) in the store's attributes. The per-tile rows
(tile cells and any scalar answers) stay the Parquet parts beside it, without the arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError, OutputError
from ..sources.grids import Geometry, GridSpec, geometry, open_grid

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..plan import JobPlan

__all__ = ["ARRAY_STORE", "ZarrRegions"]

ARRAY_STORE = "array.zarr"


class ZarrRegions:
    """Each committed shard's tensor columns into their regions of ``<output>/array.zarr``."""

    def __init__(self, cfg: JobConfig) -> None:
        src = cfg.source
        if src.format not in ("zarr", "netcdf") or len(src.paths) != 1:
            raise ConfigError(
                'sink.format: "zarr" writes the answers over one input grid; read one Zarr or NetCDF store'
            )
        self.path = Path(cfg.sink.path.removeprefix("file://")).expanduser() / ARRAY_STORE
        self.name = f"array output ({self.path})"
        self.uri, self.fmt, self.spec = str(src.paths[0]), src.format, GridSpec.of(src)
        self.skip = set(cfg.passthrough_columns)
        self.geo: Geometry | None = None
        self.group: Any = None

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        import zarr

        ds = open_grid(self.uri, self.fmt)
        self.geo = geometry(ds, self.spec, self.uri)
        self.group = zarr.open_group(str(self.path), mode="a", zarr_format=3)
        identity = {"bulkinfer_model": plan.model_location, "bulkinfer_model_digest": plan.model_digest,
                    "bulkinfer_job": plan.fingerprint}  # fmt: skip
        self.group.attrs.update({**_plain(ds.attrs), **identity})
        for d in self.geo.dims:
            if d in ds.coords and d not in self.group:
                values = np.asarray(ds[d].values)
                coord = self.group.create_array(d, shape=values.shape, dtype=values.dtype, dimension_names=[d])
                coord[...] = values
                coord.attrs.update(_plain(ds[d].attrs))

    def write(self, part: str, table: pa.Table) -> None:
        geo = self.geo
        assert geo is not None, "start() first"
        columns = [
            f.name for f in table.schema if isinstance(f.type, pa.FixedShapeTensorType) and f.name not in self.skip
        ]
        own = tuple(geo.tiles[j] for j in geo.kept)  # a tile's cells, as the model's answer holds them
        for name in columns:
            values = table[name].combine_chunks().to_numpy_ndarray()
            if tuple(values.shape[values.ndim - len(own) :]) != own:
                raise OutputError(
                    f"output column {name!r}: holds {values.shape[1:]} a tile, not arrays over the tile's cells {own}; "
                    'sink.format = "zarr" writes arrays over the grid (use parquet for other arrays)'
                )
            array = self._array(name, values, geo)
            for i, index in enumerate(table["tile_index"].to_pylist()):
                cells = geo.cells(int(index))
                block = values[i].reshape(*values.shape[1 : values.ndim - len(geo.kept)],
                                          *(geo.tiles[j] for j in range(len(geo.dims))))  # fmt: skip
                lead = (slice(None),) * (block.ndim - len(geo.dims))
                within = tuple(slice(0, stop - start) for start, stop in cells)
                array[(*lead, *(slice(a, b) for a, b in cells))] = block[(*lead, *within)]

    def _array(self, name: str, values: np.ndarray, geo: Geometry) -> Any:
        """The store's array for column ``name`` (made on its first tile, with the tiling's chunks)."""
        lead = values.shape[1 : values.ndim - len(geo.kept)]
        shape, chunks = (*lead, *geo.sizes), (*lead, *geo.tiles)
        if name in self.group:
            array = self.group[name]
            if tuple(array.shape) != shape or tuple(array.chunks) != chunks:
                raise OutputError(
                    f"{self.path}/{name}: holds {array.shape} in chunks of {array.chunks}, not {shape} in chunks of "
                    f"{chunks} (this tiling's); write to another sink.path or rerun with --overwrite"
                )
            return array
        dims = [*(f"{name}_{k}" for k in range(len(lead))), *geo.dims]
        fill = np.nan if np.issubdtype(values.dtype, np.floating) else 0
        return self.group.create_array(name, shape=shape, chunks=chunks, dtype=values.dtype, fill_value=fill,
                                       dimension_names=dims)  # fmt: skip

    def complete(self) -> None:
        """The store's metadata consolidated (one read opens it; xarray and zarr-python read it,
        which is what zarr-python's warning that Zarr v3 does not specify it is about)."""
        import warnings

        import zarr

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata")
            zarr.consolidate_metadata(str(self.path))

    def close(self) -> None:
        """Nothing held."""


def _plain(attrs: Any) -> dict[str, Any]:
    """Attributes as JSON takes them (numpy scalars and arrays as Python values)."""
    return {str(k): (v.tolist() if isinstance(v, np.ndarray | np.generic) else v) for k, v in dict(attrs).items()}
