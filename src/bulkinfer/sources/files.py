"""Input files: expand paths, directories and globs (any fsspec URI), fingerprint each file."""

from __future__ import annotations

import glob as _glob
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import SourceError

__all__ = [
    "InputFile",
    "concurrently",
    "expand_inputs",
    "filesystem",
    "list_inputs",
    "open_binary",
    "path_or_file",
    "read_range",
    "read_whole",
]

_HASH_BYTES = 64 * 1024


@dataclass(frozen=True)
class InputFile:
    """One input file and its fingerprint (size, mtime or etag, hash of head and tail).

    ``unreadable`` says why the file could not be opened (planning reports it and skips it).
    """

    uri: str
    format: str
    size: int
    version: str
    digest: str
    unreadable: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.unreadable is None:
            del data["unreadable"]  # the record of a readable file is what it was before the field existed
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputFile:
        return cls(**data)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def path_or_file(uri: str) -> Any:
    """A local path as is (pyarrow reads it fastest), else an open binary file."""
    fs, path = filesystem(uri)
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.open(path, "rb")


def read_whole(where: str) -> bytes | None:
    """A small file (an output's manifest, plan or statistics), local or in an object store; None when absent."""
    fs, path = filesystem(where)
    try:
        data: bytes = fs.cat_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"{where}: cannot read it ({' '.join(str(exc).split())[:200]})", where) from exc
    return data


def open_binary(uri: str) -> Any:
    fs, path = filesystem(uri)
    return fs.open(path, "rb")


def read_range(shard: Any) -> bytes:
    """The bytes of a line-format shard's planned range."""
    assert shard.offset is not None and shard.end is not None
    with open_binary(shard.uri) as fh:
        fh.seek(shard.offset)
        data: bytes = fh.read(shard.end - shard.offset)
    return data


def _qualify(fs: fsspec.AbstractFileSystem, path: str) -> str:
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.unstrip_protocol(path)


def _is_data_file(path: str, extensions: Sequence[str]) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith(("_", ".")) and any(name.lower().endswith(e) for e in extensions)


def _expand(pattern: str, extensions: Sequence[str]) -> list[str]:
    fs, path = filesystem(pattern)
    if _glob.has_magic(path):
        found = [p for p in fs.glob(path) if fs.isfile(p)]
        if not found:
            raise SourceError(f"{pattern}: the pattern matches no file; check the path", pattern)
        return [_qualify(fs, p) for p in found]
    if fs.isdir(path):
        found = [p for p in fs.find(path) if _is_data_file(p, extensions)]
        if not found:
            raise SourceError(f"{pattern}: the directory holds no {', '.join(extensions)} file", pattern)
        return [_qualify(fs, p) for p in found]
    if fs.isfile(path):
        return [_qualify(fs, path)]
    raise SourceError(f"{pattern}: no such file or directory; check the path", pattern)


def expand_inputs(pattern: str) -> list[str]:
    """The files a path, directory or glob names (data files of the known formats in a directory)."""
    from .registry import EXTENSIONS

    return _expand(pattern, list(EXTENSIONS))


def fingerprint(uri: str, fmt: str) -> InputFile:
    fs, path = filesystem(uri)
    info = fs.info(path)
    size = int(info.get("size") or 0)
    version = str(
        info.get("ETag")
        or info.get("etag")
        or info.get("mtime")
        or info.get("LastModified")
        or info.get("created")
        or ""
    )
    try:
        h = hashlib.sha256()
        with fs.open(path, "rb") as f:
            h.update(f.read(_HASH_BYTES))
            if size > _HASH_BYTES:
                f.seek(max(_HASH_BYTES, size - _HASH_BYTES))
                h.update(f.read(_HASH_BYTES))
    except OSError as exc:  # planning reports it as a problem of this file; the job goes on with the others
        why = str(exc.strerror or exc)
        return InputFile(uri=uri, format=fmt, size=size, version=version, digest="", unreadable=why)
    return InputFile(uri=uri, format=fmt, size=size, version=version, digest=h.hexdigest()[:32])


def list_inputs(
    patterns: Sequence[str], declared_format: str = "auto", source: Any = None, columns: Sequence[str] = ()
) -> list[InputFile]:
    """Expand paths, directories and globs into fingerprinted files, sorted, without duplicates;
    for a Delta or Iceberg source (``source``: its config), the data files of the chosen snapshot."""
    from .registry import EXTENSIONS, detect_format

    if declared_format in ("delta", "iceberg"):
        from .tables import table_inputs

        return table_inputs(patterns, source, columns)

    uris: list[str] = []
    for pattern in patterns:
        uris.extend(_expand(pattern, list(EXTENSIONS)))
    unique = sorted(set(uris))
    formats = [detect_format(u, declared_format) for u in unique]
    return concurrently(lambda pair: fingerprint(*pair), list(zip(unique, formats, strict=True)), unique)


T = TypeVar("T")
R = TypeVar("R")
PLANNING_THREADS = 16


def concurrently(fn: Callable[[T], R], items: Sequence[T], uris: Sequence[str] = ()) -> list[R]:
    """``fn`` over ``items``, results in order, the first exception raised as in a loop: on up to
    16 threads when ``uris`` name an object store (planning then waits on requests), in this
    thread for local files (where threads only contend for the interpreter: measured slower)."""
    remote = any("://" in u and not u.startswith("file://") for u in uris)
    if len(items) < 4 or not remote or PLANNING_THREADS <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(PLANNING_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))
