"""``[source]``: where the rows come from."""

from __future__ import annotations

import codecs
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..core.media import looks_like_images, looks_like_tars, looks_like_videos
from .section import Section


class VideoConfig(Section):
    fps: float = Field(default=1.0, gt=0)
    """Frames sampled a second: row k is the first frame shown at or after k / fps seconds (at most the
    video's own rate)."""
    keyframes: bool = False
    """Sample every keyframe instead (fps is then not used)."""


class SourceConfig(Section):
    kind: Literal["files", "feast"] = "files"
    """files: the rows are the input files' (source.paths); feast: the files are an entity table (source.id_column,
    the entity key; source.timestamp_column) and each row's features are read from the Feast repo
    source.feast_repo as of its timestamp (docs/feature-store.md)."""
    paths: list[str] = Field(default_factory=list)
    """Input files: paths, directories, globs or fsspec URIs (file://, memory://, s3://...)."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options for the inputs' object store (s3: endpoint_url, key, secret, profile, client_kwargs...);
    empty: the store's usual configuration (AWS_* variables, a profile, an instance role). Never stored."""
    format: Literal[
        "auto",
        "parquet",
        "csv",
        "jsonl",
        "delta",
        "iceberg",
        "openai-batch",
        "images",
        "webdataset",
        "video",
        "zarr",
        "netcdf",
    ] = "auto"
    """Input format; 'auto' picks it from each file's extension (a .jsonl file of OpenAI batch requests:
    openai-batch; paths or globs that all end in a picture's extension, photos/*.jpg: images). delta: paths
    are Delta Lake tables; iceberg: paths are Iceberg table names in source.catalog; images: each path (a
    folder, glob or URI) is a set of pictures, one row each (columns id, path, image); webdataset (.tar): WebDataset
    shards, one row per key (id, image, text, and the .json member's fields); video (.mp4, .mkv, .webm, .mov, .avi):
    one row per sampled frame (id, video_id, timestamp_s, frame_index, image), see source.video."""
    id_column: str | None = None
    """Column that identifies a row; copied to the output and to error records. Optional (pictures: 'id',
    each file's path relative to its input's root)."""
    max_image_pixels: int = Field(default=89_478_485, ge=1, le=178_956_970)
    """A picture of more pixels than this is an error row, never decoded (a decompression bomb). The
    default is Pillow's warning limit; Pillow refuses any picture over twice that, so the limit stops there."""
    decode: Literal["exact", "reduced"] = "exact"
    """Pictures: 'exact' decodes every picture at full size; 'reduced' decodes a JPEG at 1/2, 1/4 or 1/8 of its
    size straight from its DCT, the most that keeps it at least the model's input size (ONNX vision models), and
    is gated like a lowered precision: the job's sample rows must answer as the exact decode does."""
    max_decoded_mb: int = Field(default=512, ge=1)
    """Decoded pictures in flight at once, in MiB (width x height x channels of each, counted before it is
    decoded): the decode pool waits under it, so memory stays flat whatever the pictures' sizes."""
    shard_rows: int = Field(default=10_000, ge=1)
    """Target rows per shard, the unit of commit and resume (Parquet shards follow row groups)."""
    max_record_bytes: int = Field(default=64 << 20, ge=1)
    """A record longer than this (a JSONL, batch-file or CSV record; a columnar row's text and binary
    values in the columns read) is an error row naming its size; line formats never read it."""
    read_batch_rows: int = Field(default=4096, ge=1)
    """Rows per Arrow record batch read from the input."""
    column_types: dict[str, str] = Field(default_factory=dict)
    """Arrow types of input columns ({id = "string", price = "double"}); the others are the
    types the files start with, unified across files (int and double: double; else string)."""
    version: int | None = Field(default=None, ge=0)
    """Delta: the table version to read (default: the latest)."""
    snapshot_id: int | None = None
    """Iceberg: the snapshot to read (default: the current one)."""
    as_of: str | None = None
    """Delta or Iceberg: read the table as it was at this ISO 8601 time (2026-12-02T23:00:00Z)."""
    catalog: dict[str, Any] = Field(default_factory=dict)
    """Iceberg: the catalog's name and properties, as pyiceberg's load_catalog takes them
    ({name = "prod", type = "sql", uri = "sqlite:///cat.db", warehouse = "file:///wh"})."""
    encoding: str = "auto"
    """Text encoding of CSV and JSONL inputs: 'auto' (UTF-8, or what a byte-order mark says: UTF-8, UTF-16,
    UTF-32) or a Python codec's name (latin-1, cp1252, utf-16, shift_jis...); utf-16 and utf-32 without a
    mark are read little-endian. A byte not in the encoding fails its file with one line naming it."""
    previous: str | None = None
    """An earlier output of this job, written with input hashes (--incremental-from): rows whose id and
    input are unchanged take their results from it instead of being inferred."""

    video: VideoConfig = Field(default_factory=lambda: VideoConfig())
    """Videos: how frames are sampled ({fps = 2} or {keyframes = true})."""
    variables: list[str] = Field(default_factory=list)
    """Zarr/NetCDF: the data variables read, stacked in this order as each tile's first axis (default: all)."""
    tile: dict[str, int] = Field(default_factory=dict)
    """Zarr/NetCDF: cells per tile by dimension ({time = 1, y = 256, x = 256}); a dimension not named is read
    whole, one tiled by 1 with no halo is dropped from the tile's array. Each row is one tile."""
    halo: dict[str, int] = Field(default_factory=dict)
    """Zarr/NetCDF: neighbour cells added each side of a tile by dimension ({y = 16, x = 16}; at most the tile),
    cut from the model's answer again (docs/science.md#gridded-arrays)."""
    pad: Literal["reflect", "edge", "constant"] = "reflect"
    """Zarr/NetCDF: how a tile is filled where the grid ends (numpy.pad's modes; constant: source.pad_value)."""
    pad_value: float = 0.0
    """Zarr/NetCDF with pad = "constant": the value beyond the grid's edge."""
    nan_tiles: Literal["run", "error"] = "run"
    """Zarr/NetCDF: a tile whose own cells are all NaN (land in an ocean grid, a gap): run gives it to the model
    as any tile; error makes it an error row naming the tile (the model never sees it)."""

    feast_repo: str = ""
    """kind = "feast": the Feast repo's folder (its feature_store.yaml), applied (feast apply)."""
    features: list[str] = Field(default_factory=list)
    """kind = "feast": the feature refs read for each row ("view:feature"), in the model's feature order."""
    feature_service: str = ""
    """kind = "feast": a Feast feature service whose features are read, instead of source.features."""
    timestamp_column: str = "event_timestamp"
    """kind = "feast": the entity table's column of event times; each row's features are those as of it."""

    @model_validator(mode="before")
    @classmethod
    def _pictures_by_name(cls, data: Any) -> Any:
        """Paths that all name pictures (or tars) by extension are read as pictures (WebDataset shards), their
        rows identified by path (key)."""
        if not isinstance(data, dict):
            return data
        paths = data.get("paths") or []
        if data.get("format", "auto") == "auto" and paths and all(looks_like_images(str(p)) for p in paths):
            data = {**data, "format": "images"}
        if data.get("format", "auto") == "auto" and paths and all(looks_like_tars(str(p)) for p in paths):
            data = {**data, "format": "webdataset"}
        if data.get("format", "auto") == "auto" and paths and all(looks_like_videos(str(p)) for p in paths):
            data = {**data, "format": "video"}
        for fmt, ends in (("zarr", (".zarr", ".zarr/")), ("netcdf", (".nc", ".nc4"))):
            if data.get("format", "auto") == "auto" and paths and all(str(p).lower().endswith(ends) for p in paths):
                data = {**data, "format": fmt}
        if data.get("format") in ("images", "webdataset", "video") and data.get("id_column") is None:
            data = {**data, "id_column": "id"}
        if data.get("format") in ("zarr", "netcdf") and data.get("id_column") is None:
            data = {**data, "id_column": "tile_index"}
        return data

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        if value == "auto":
            return value
        try:
            info = codecs.lookup(value)
        except LookupError:
            raise ValueError(f"unknown text encoding {value!r}; use auto or a codec such as cp1252 or utf-16") from None
        if not getattr(info, "_is_text_encoding", True):
            raise ValueError(f"{value!r} is not a text encoding; use auto or a codec such as cp1252 or utf-16")
        return value

    @model_validator(mode="after")
    def _video_of_videos(self) -> SourceConfig:
        if self.video != VideoConfig() and self.format not in ("auto", "video"):
            raise ValueError(f"video applies to video inputs, not to format {self.format!r}; leave it unset")
        return self

    @model_validator(mode="after")
    def _tiles_of_grids(self) -> SourceConfig:
        used = [n for n in ("variables", "tile", "halo") if getattr(self, n)] + (
            ["nan_tiles"] if self.nan_tiles != "run" else []
        )
        if used and self.format not in ("zarr", "netcdf"):
            raise ValueError(
                f"{used[0]} applies to zarr and netcdf inputs, not to format {self.format!r}; leave it unset"
            )
        bad = next((f"tile.{d} = {n}" for d, n in self.tile.items() if n < 1), None)
        bad = bad or next((f"halo.{d} = {n}" for d, n in self.halo.items() if n < 0), None)
        if bad:
            raise ValueError(f"{bad}: a tile is at least 1 cell, a halo at least 0")
        return self

    @model_validator(mode="after")
    def _encoding_of_text(self) -> SourceConfig:
        if self.encoding != "auto" and self.format in ("parquet", "delta", "iceberg"):
            raise ValueError(f"encoding applies to CSV and JSONL inputs, not to format {self.format!r}; leave it unset")
        return self

    @field_validator("column_types")
    @classmethod
    def _known_types(cls, value: dict[str, str]) -> dict[str, str]:
        from ..core.schema import parse_type

        for name, type_name in value.items():
            try:
                parse_type(type_name)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return value
