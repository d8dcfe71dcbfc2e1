"""Input files: expand paths, directories and globs (any fsspec URI) into the data files of the
known formats, and fingerprint each file (size, version, a hash of head and tail)."""

from __future__ import annotations

import glob as _glob
import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..core.errors import SourceError
from ..core.media import looks_like_images
from ..core.storage import concurrently, files_only, filesystem, store_trouble
from .base import InputFile
from .encoding import LINE_FORMATS, codec_of
from .images import image_inputs
from .parquet import keep_footer
from .registry import EXTENSIONS, detect_format
from .tables import table_inputs
from .video import sampling_spec

__all__ = ["expand_inputs", "fingerprint", "list_inputs"]

_HASH_BYTES = 64 * 1024


def _qualify(fs: fsspec.AbstractFileSystem, path: str) -> str:
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.unstrip_protocol(path)


def _is_data_file(path: str, extensions: Sequence[str]) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith(("_", ".")) and any(name.lower().endswith(e) for e in extensions)


def _expand(pattern: str, extensions: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The files ``pattern`` names, each with what its listing said of it (size, ETag or
    mtime): a listing of a directory or a glob costs one request per 1,000 objects on an
    object store, where asking each file would cost one per file."""
    try:
        return _listing(pattern, extensions)
    except SourceError:
        raise
    except Exception as exc:  # the store's client raised it: any library, any kind
        raise store_trouble(pattern, exc) from exc


def _listing(pattern: str, extensions: Sequence[str]) -> dict[str, dict[str, Any]]:
    fs, path = filesystem(pattern)
    if _glob.has_magic(path):
        found = files_only(fs, fs.glob(path, detail=True))
        if not found:
            raise SourceError(f"{pattern}: the pattern matches no file; check the path", pattern)
        return {_qualify(fs, p): info for p, info in found.items()}
    if fs.isdir(path):
        found = {p: i for p, i in files_only(fs, fs.find(path, detail=True)).items() if _is_data_file(p, extensions)}
        if not found:
            pictures = any(looks_like_images(p) for p in files_only(fs, fs.find(path, detail=True)))
            hint = "; it holds pictures: pass --set source.format=images" if pictures else ""
            raise SourceError(f"{pattern}: the directory holds no {', '.join(extensions)} file{hint}", pattern)
        return {_qualify(fs, p): info for p, info in found.items()}
    if fs.isfile(path):
        return {_qualify(fs, path): fs.info(path)}
    raise SourceError(f"{pattern}: no such file or directory; check the path", pattern)


def expand_inputs(pattern: str) -> list[str]:
    """The files a path, directory or glob names (data files of the known formats in a directory)."""
    return list(_expand(pattern, list(EXTENSIONS)))


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
    version = str(tag or info.get("mtime") or info.get("LastModified") or info.get("created") or "")
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
    codec = codec_of(head, encoding) if fmt in LINE_FORMATS else None
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

    found: dict[str, dict[str, Any]] = {}
    for pattern in patterns:
        found.update(_expand(pattern, list(EXTENSIONS)))
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
