"""Paths, directories and globs (any fsspec URI) expanded into the files they name, each with
what its listing said of it: the one expansion every input kind shares (a directory's files
filtered by the kind's extensions)."""

from __future__ import annotations

import glob as _glob
from collections.abc import Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..core.errors import SourceError
from ..core.media import looks_like_images
from ..core.storage import files_only, filesystem, store_trouble

__all__ = ["expand", "is_data_file", "qualify"]


def qualify(fs: fsspec.AbstractFileSystem, path: str) -> str:
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.unstrip_protocol(path)


def is_data_file(path: str, extensions: Sequence[str]) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith(("_", ".")) and any(name.lower().endswith(e) for e in extensions)


def expand(pattern: str, extensions: Sequence[str]) -> dict[str, dict[str, Any]]:
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
        return {qualify(fs, p): info for p, info in found.items()}
    if fs.isdir(path):
        found = {p: i for p, i in files_only(fs, fs.find(path, detail=True)).items() if is_data_file(p, extensions)}
        if not found:
            pictures = any(looks_like_images(p) for p in files_only(fs, fs.find(path, detail=True)))
            hint = "; it holds pictures: pass --set source.format=images" if pictures else ""
            raise SourceError(f"{pattern}: the directory holds no {', '.join(extensions)} file{hint}", pattern)
        return {qualify(fs, p): info for p, info in found.items()}
    if fs.isfile(path):
        return {qualify(fs, path): fs.info(path)}
    raise SourceError(f"{pattern}: no such file or directory; check the path", pattern)
