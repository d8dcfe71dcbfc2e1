"""Input files: expand paths, directories and globs (any fsspec URI) into the data files of the
known formats, and fingerprint each file (size, version, a hash of head and tail)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..core.storage import concurrently, filesystem, listed_version
from .encoding import LINE_FORMATS, codec_of
from .expand import expand
from .grids import GRID_FORMATS, GridSpec, grid_inputs
from .images import image_inputs
from .parquet import keep_footer
from .registry import EXTENSIONS, detect_format
from .shard import InputFile
from .tables import table_inputs
from .video import sampling_spec

__all__ = ["expand_inputs", "fingerprint", "list_inputs"]

_HASH_BYTES = 64 * 1024


def expand_inputs(pattern: str) -> list[str]:
    """The files a path, directory or glob names (data files of the known formats in a directory)."""
    return list(expand(pattern, list(EXTENSIONS)))


def fingerprint(
    uri: str, fmt: str, info: dict[str, Any] | None = None, known: InputFile | None = None, encoding: str = "auto"
) -> InputFile:
    """``uri``'s fingerprint: size and version from ``info`` (its listing's entry) or asked
    for, and a hash of its first and last 64 KiB, read by two ranged reads (one for a small
    file; by keyword: s3fs takes a version id second). A Parquet file's footer found in that
    tail is kept for the planner; a line format's codec is settled from its head and
    ``encoding`` (``source.encoding``).

    ``known`` is the fingerprint a plan holds (a resume): when the store names versions by
    an entity tag (S3, GCS, Azure: a new tag for new content) and size and tag are the
    ones known, it is taken without reading the file. Elsewhere (an mtime can be set back)
    the hash is read again."""
    fs, path = filesystem(uri)
    if info is None:
        info = fs.info(path)
    size = int(info.get("size") or 0)
    tag = info.get("ETag") or info.get("etag")
    version = listed_version(info)
    if tag and known is not None and known.format == fmt and (known.size, known.version) == (size, version):
        return known
    try:
        h = hashlib.sha256()
        tail = head = fs.cat_file(path, start=0, end=min(size, _HASH_BYTES)) if size else b""
        h.update(head)
        if size > _HASH_BYTES:
            tail = fs.cat_file(path, start=max(_HASH_BYTES, size - _HASH_BYTES), end=size)
            h.update(tail)
    except Exception as exc:  # planning reports it as a problem of this file; the job goes on with the others
        why = str(getattr(exc, "strerror", None) or exc)  # (OSError, or what a store's client raised)
        return InputFile(uri=uri, format=fmt, size=size, version=version, digest="", unreadable=why)
    codec = codec_of(head, encoding, uri) if fmt in LINE_FORMATS else None
    f = InputFile(uri=uri, format=fmt, size=size, version=version, digest=h.hexdigest()[:32], encoding=codec)
    if fmt == "parquet":
        keep_footer(f, tail)
    return f


def list_inputs(
    patterns: Sequence[str],
    declared_format: str = "auto",
    source: Any = None,
    columns: Sequence[str] = (),
    known: Sequence[InputFile] = (),
) -> list[InputFile]:
    """Expand paths, directories and globs into fingerprinted files, sorted, without duplicates;
    for a Delta or Iceberg source (``source``: its config), the data files of the chosen snapshot.
    ``known``: the fingerprints the output's plan holds (see :func:`fingerprint`)."""
    if declared_format in ("delta", "iceberg"):
        return table_inputs(patterns, source, columns)
    if declared_format == "images":
        return image_inputs(patterns)
    if declared_format in GRID_FORMATS:
        return grid_inputs(_stores(patterns, declared_format), declared_format, GridSpec.of(source))

    found: dict[str, dict[str, Any]] = {}
    for pattern in patterns:
        found.update(expand(pattern, list(EXTENSIONS)))
    unique = sorted(found)
    before = {f.uri: f for f in known}
    encoding = getattr(source, "encoding", "auto")
    items = [(u, detect_format(u, declared_format), found[u], before.get(u), encoding) for u in unique]
    files = concurrently(lambda item: fingerprint(*item), items, unique)
    video = getattr(source, "video", None)
    if video is not None:  # how each video's rows are sampled: carried into its shards, part of its fingerprint
        spec = sampling_spec(video.fps, video.keyframes)
        files = [replace(f, encoding=spec) if f.format == "video" else f for f in files]
    return files


def _stores(patterns: Sequence[str], fmt: str) -> list[str]:
    """A Zarr store is the directory named; NetCDF files are listed as any file (globs, directories)."""
    if fmt == "zarr":
        return [p.rstrip("/") for p in patterns]
    return [uri for pattern in patterns for uri in expand(pattern, [".nc", ".nc4"])]
