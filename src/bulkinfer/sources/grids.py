"""Gridded arrays (``source.format = "zarr"`` or ``"netcdf"``, read through xarray), cut into
tiles with a halo.

Each row is one tile: the variables of ``source.variables`` (stacked in that order as the
tile's first axis) over the tile's cells plus ``source.halo`` cells of its neighbours on each
side, padded where the grid ends (``source.pad``: reflect, edge or constant ``pad_value``) so
that every tile has one shape, the edge tiles' cells beyond the grid included. A dimension tiled
by 1 with no halo is dropped from the array (``{time = 1, y = 256, x = 256}`` over four
variables gives 4 × (256 + 2 halo) × (256 + 2 halo)); a dimension not in ``source.tile`` is
read whole. Tiles are numbered in C order over the dimensions as the variables hold them; a
shard is ``source.shard_rows`` consecutive tiles. Columns: ``tile_index``, ``<dim>_start`` and
``<dim>_stop`` (the tile's own cells, the grid's end clipped) per dimension of ``source.tile``
(kept in the output), and ``tile``
(a ``fixed_shape_tensor`` whose ``dim_names`` are ``variable`` and the dimensions it keeps: the
adapter finds the halo to cut from the model's answer by them, :mod:`bulkinfer.adapters.tiles`).

The input's fingerprint covers the store's metadata (dimensions, variables, coordinates and
attributes) and every file of it (name, size, modification time): a rewritten chunk is a new
input. The tiling travels with the input (its ``encoding`` slot, as a video's sampling does), so
another tiling is another job.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError, SourceError
from ..core.storage import filesystem
from .shard import BATCH_BYTES, ROW, BadRow, InputFile, Shard, Span

__all__ = ["GRID_FORMATS", "GridFormat", "GridSpec", "grid_inputs", "open_grid"]

GRID_FORMATS = ("zarr", "netcdf")


@dataclass(frozen=True)
class GridSpec:
    """How a grid is cut: the variables, the tile and halo per dimension, and the padding."""

    variables: tuple[str, ...] = ()
    tile: Mapping[str, int] = field(default_factory=dict)
    halo: Mapping[str, int] = field(default_factory=dict)
    pad: str = "reflect"
    pad_value: float = 0.0
    nan_tiles: str = "run"

    def to_text(self) -> str:
        data = asdict(self)
        data["variables"] = list(self.variables)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def of(cls, source: Any) -> GridSpec:
        """The tiling ``[source]`` asks for."""
        return cls(tuple(source.variables), dict(source.tile), dict(source.halo), source.pad, source.pad_value,
                   source.nan_tiles)  # fmt: skip

    @classmethod
    def from_text(cls, text: str | None) -> GridSpec:
        data = json.loads(text or "{}")
        return cls(**{**data, "variables": tuple(data.get("variables", ()))})


@dataclass(frozen=True)
class Geometry:
    """A grid's tiling: the dimensions as the variables hold them, their sizes, each one's tile
    (its size when not tiled) and halo, the variables and the tile's array shape."""

    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    tiles: tuple[int, ...]
    halos: tuple[int, ...]
    variables: tuple[str, ...]

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(math.ceil(n / t) for n, t in zip(self.sizes, self.tiles, strict=True))

    @property
    def tile_count(self) -> int:
        return math.prod(self.counts)

    @property
    def kept(self) -> tuple[int, ...]:
        """The axes the tile's array keeps (a dimension tiled by 1 with no halo is dropped)."""
        return tuple(i for i, (t, h) in enumerate(zip(self.tiles, self.halos, strict=True)) if t > 1 or h > 0)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.variables), *(self.tiles[i] + 2 * self.halos[i] for i in self.kept))

    def cells(self, index: int) -> list[tuple[int, int]]:
        """The tile's own cells per dimension: ``(start, stop)``, the grid's end clipped."""
        at = np.unravel_index(index, self.counts)
        return [(int(a) * t, min((int(a) + 1) * t, n)) for a, t, n in zip(at, self.tiles, self.sizes, strict=True)]


def open_grid(uri: str, fmt: str) -> Any:
    """The store at ``uri`` as a lazy ``xarray.Dataset`` (nothing read but its metadata)."""
    try:
        import xarray as xr
    except ImportError:
        raise ConfigError(f"source.format: {fmt} needs xarray; pip install 'bulkinfer[science]'") from None
    try:
        # no dask, and no cache: a tile read is read, never a whole variable kept (memory flat in the grid's size)
        if fmt == "zarr":
            return xr.open_dataset(uri, engine="zarr", chunks=None, cache=False)
        return xr.open_dataset(filesystem(uri)[1] if uri.startswith("file://") else uri, chunks=None, cache=False)
    except (OSError, ValueError, KeyError) as exc:
        raise SourceError(f"{uri}: not a {fmt} store xarray can open ({type(exc).__name__}: {exc})", uri) from None


def geometry(ds: Any, spec: GridSpec, uri: str) -> Geometry:
    """The tiling of ``ds`` that ``spec`` asks for; a variable or dimension it lacks, variables of
    other dimensions, or a halo wider than its tile is one line naming the setting."""
    names = list(spec.variables) or [str(v) for v in ds.data_vars]
    missing = [v for v in names if v not in ds.data_vars]
    if missing:
        raise ConfigError(
            f"source.variables: {uri} has no variable {missing[0]!r}; it has {', '.join(map(str, ds.data_vars))}"
        )
    dims = tuple(str(d) for d in ds[names[0]].dims)
    other = next((v for v in names if tuple(map(str, ds[v].dims)) != dims), None)
    if other is not None:
        raise ConfigError(f"source.variables: {other!r} is over {tuple(ds[other].dims)}, {names[0]!r} over {dims}; "
                          "tile variables of one set of dimensions together")  # fmt: skip
    for setting, sizes in (("source.tile", spec.tile), ("source.halo", spec.halo)):
        unknown = next((d for d in sizes if d not in dims), None)
        if unknown is not None:
            raise ConfigError(
                f"{setting}: {uri}'s variables have no dimension {unknown!r}; they have {', '.join(dims)}"
            )
    for d, h in spec.halo.items():
        if h > spec.tile.get(d, 0):
            raise ConfigError(f"source.halo: {d} = {h} is wider than its tile ({spec.tile.get(d, 'not tiled')}); "
                              f"tile {d} by at least {h}")  # fmt: skip
    extent = tuple(int(ds.sizes[d]) for d in dims)
    tiles = tuple(min(spec.tile.get(d, n), n) for d, n in zip(dims, extent, strict=True))
    return Geometry(dims, extent, tiles, tuple(spec.halo.get(d, 0) for d in dims), tuple(names))


def _extent(geo: Geometry, index: int) -> list[tuple[int, int]]:
    """Tile ``index``'s full extent per dimension, halo included (beyond the grid where it ends)."""
    cells = geo.cells(index)
    return [(start - h, start + t + h) for (start, _stop), t, h in zip(cells, geo.tiles, geo.halos, strict=True)]


def read_tiles(ds: Any, geo: Geometry, indices: Sequence[int], spec: GridSpec) -> dict[int, np.ndarray]:
    """Tiles ``indices`` with their halos, each padded to the tile's full shape (``geo.shape``).
    The cells the tiles span are read once, as one box per variable (a tile's halo lies in its
    neighbours' chunks: read tile by tile, each chunk would be read up to nine times)."""
    extents = [_extent(geo, i) for i in indices]
    lo = [max(min(e[d][0] for e in extents), 0) for d in range(len(geo.dims))]
    hi = [min(max(e[d][1] for e in extents), n) for d, n in enumerate(geo.sizes)]
    box_at = {name: slice(a, b) for name, a, b in zip(geo.dims, lo, hi, strict=True)}
    box = np.stack([np.asarray(ds[v].isel(box_at).values, dtype=np.float32) for v in geo.variables])
    kw: dict[str, Any] = {"constant_values": spec.pad_value} if spec.pad == "constant" else {}
    tiles = {}
    for index, extent in zip(indices, extents, strict=True):
        cut = [slice(max(a, 0) - lo[d], min(b, geo.sizes[d]) - lo[d]) for d, (a, b) in enumerate(extent)]
        pads = [(max(a, 0) - a, b - min(b, geo.sizes[d])) for d, (a, b) in enumerate(extent)]
        tile = box[(slice(None), *cut)]
        if any(x or y for x, y in pads):
            tile = np.pad(tile, [(0, 0), *pads], mode=spec.pad, **kw)  # type: ignore[call-overload]
        tiles[index] = np.ascontiguousarray(tile).reshape(geo.shape)
    return tiles


def _store_digest(uri: str, ds: Any) -> tuple[int, str, str]:
    """Size, newest modification time and a digest of the store's metadata and files."""
    fs, path = filesystem(uri)
    entries = fs.find(path, detail=True) if fs.isdir(path) else {path: fs.info(path)}
    h = hashlib.sha256()
    meta = {"dims": dict(ds.sizes), "attrs": ds.attrs, "vars": {str(k): [str(v.dtype), list(v.dims), v.attrs]
            for k, v in ds.variables.items()}}  # fmt: skip
    h.update(json.dumps(meta, sort_keys=True, default=str).encode())
    for name, coord in sorted(ds.coords.items()):
        h.update(f"{name}:".encode() + np.ascontiguousarray(coord.values).tobytes())
    newest = ""
    for name in sorted(entries):
        info = entries[name]
        mtime = str(info.get("mtime") or info.get("LastModified") or info.get("ETag") or "")
        newest = max(newest, mtime)
        h.update(f"{name[len(path) :]}\0{info.get('size')}\0{mtime}\n".encode())
    return sum(int(e.get("size") or 0) for e in entries.values()), newest, h.hexdigest()[:32]


def grid_inputs(patterns: Sequence[str], fmt: str, spec: GridSpec) -> list[InputFile]:
    """One input per store, fingerprinted, its tiling checked (before any row) and carried."""
    files = []
    for uri in sorted(dict.fromkeys(patterns)):
        ds = open_grid(uri, fmt)
        geometry(ds, spec, uri)
        size, version, digest = _store_digest(uri, ds)
        files.append(InputFile(uri=uri, format=fmt, size=size, version=version, digest=digest, encoding=spec.to_text()))
    return files


@lru_cache(maxsize=8)
def _opened(uri: str, fmt: str, spec_text: str) -> tuple[Any, Geometry, GridSpec]:
    spec = GridSpec.from_text(spec_text)
    ds = open_grid(uri, fmt)
    return ds, geometry(ds, spec, uri), spec


class GridFormat:
    """Zarr or NetCDF stores as rows of tiles (:mod:`bulkinfer.sources.grids`)."""

    def __init__(self, name: str, extensions: tuple[str, ...]) -> None:
        self.name, self.extensions = name, extensions

    def plan(self, f: InputFile, shard_rows: int, max_record: int = 0) -> list[Span]:
        _ds, geo, _spec = _opened(f.uri, f.format, f.encoding or "{}")
        n = geo.tile_count
        return [Span(s, min(s + shard_rows, n)) for s in range(0, n, shard_rows)]

    def head_schema(self, f: InputFile) -> pa.Schema:
        _ds, geo, _spec = _opened(f.uri, f.format, f.encoding or "{}")
        return _schema(geo, _spec)

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        ds, geo, spec = _opened(shard.uri, shard.format, shard.encoding or "{}")
        schema = _schema(geo, spec).append(pa.field(ROW, pa.int64()))
        step = max(1, min(batch_rows, BATCH_BYTES // (4 * math.prod(geo.shape))))  # a batch's tiles: ~32 MB
        for first in range(shard.start, shard.stop, step):
            read = read_tiles(ds, geo, range(first, min(first + step, shard.stop)), spec)
            if spec.nan_tiles == "error":
                read = _without_nan_tiles(read, geo, bad)
            if not read:
                continue
            indices = list(read)
            cells = [geo.cells(i) for i in indices]
            data: dict[str, Any] = {"tile_index": pa.array(indices, pa.int64())}
            for j, d in enumerate(geo.dims):
                if d in spec.tile:
                    data[f"{d}_start"] = pa.array([c[j][0] for c in cells], pa.int64())
                    data[f"{d}_stop"] = pa.array([c[j][1] for c in cells], pa.int64())
            tiles = np.stack(list(read.values()))
            data["tile"] = pa.FixedShapeTensorArray.from_numpy_ndarray(tiles, dim_names=_dim_names(geo))
            data[ROW] = pa.array(indices, pa.int64())
            batch = pa.RecordBatch.from_pydict(data, schema=schema)
            yield batch.select([c for c in schema.names if c in columns or c == ROW])


def _without_nan_tiles(read: dict[int, np.ndarray], geo: Geometry, bad: BadRow) -> dict[int, np.ndarray]:
    """``read`` less the tiles whose own cells (no halo, nothing beyond the grid) are all NaN, each
    reported as its row's error."""
    kept = {}
    for index, tile in read.items():
        cells = geo.cells(index)
        own = tile[(slice(None), *(slice(geo.halos[i], geo.halos[i] + cells[i][1] - cells[i][0]) for i in geo.kept))]
        if np.isnan(own).all():
            where = ", ".join(f"{d} {a}..{b}" for d, (a, b) in zip(geo.dims, cells, strict=True))
            bad(index, f"tile {index} ({where}) holds only NaN (source.nan_tiles = \"error\")")
        else:
            kept[index] = tile
    return kept


def _schema(geo: Geometry, spec: GridSpec) -> pa.Schema:
    fields = [pa.field("tile_index", pa.int64())]
    for d in geo.dims:
        if d in spec.tile:
            fields += [pa.field(f"{d}_start", pa.int64()), pa.field(f"{d}_stop", pa.int64())]
    kind = pa.fixed_shape_tensor(pa.float32(), list(geo.shape), dim_names=_dim_names(geo))
    return pa.schema([*fields, pa.field("tile", kind)])


def _dim_names(geo: Geometry) -> list[str]:
    """The tile array's axes: ``variable``, then the dimensions it keeps (how the halo is found again)."""
    return ["variable", *(geo.dims[i] for i in geo.kept)]
