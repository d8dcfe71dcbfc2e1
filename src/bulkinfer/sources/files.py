"""Input files: expand paths, directories and globs (any fsspec URI), fingerprint each file."""

from __future__ import annotations

import glob as _glob
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..core.errors import SourceError

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
    "use_storage_options",
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


# source.storage_options by protocol: every input (and the previous output of an incremental
# run) on that store opens with them. Set per job (use_storage_options), in each process.
_OPTIONS: dict[str, dict[str, Any]] = {}


def use_storage_options(options: dict[str, Any], paths: Sequence[str]) -> None:
    """Open the stores ``paths`` name with ``options`` from now on (none: their usual configuration)."""
    _OPTIONS.clear()
    for p in paths if options else ():
        protocol = fsspec.core.split_protocol(p)[0]
        if protocol and protocol != "file":
            _OPTIONS[protocol] = dict(options)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    options = _OPTIONS.get(fsspec.core.split_protocol(uri)[0] or "", {})
    fs, path = fsspec.core.url_to_fs(uri, **options)
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


def _files(found: Any) -> dict[str, dict[str, Any]]:
    """A listing's files (``find``/``glob`` with ``detail=True``) by path."""
    return {p: info for p, info in found.items() if info.get("type", "file") == "file"}


def _store_trouble(where: str, exc: Exception) -> SourceError:
    """One line for a store that cannot be reached or refuses (no credentials, a wrong
    endpoint, access denied): whatever the client library raised, no traceback."""
    why = " ".join(str(exc).split())[:200] or type(exc).__name__
    return SourceError(
        f"{where}: cannot read it ({type(exc).__name__}: {why}); check the path, and the store's endpoint and "
        "credentials (source.storage_options, or the environment)",
        where,
    )


def _expand(pattern: str, extensions: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The files ``pattern`` names, each with what its listing said of it (size, ETag or
    mtime): a listing of a directory or a glob costs one request per 1,000 objects on an
    object store, where asking each file would cost one per file."""
    try:
        return _listing(pattern, extensions)
    except SourceError:
        raise
    except Exception as exc:  # the store's client raised it: any library, any kind
        raise _store_trouble(pattern, exc) from exc


def _listing(pattern: str, extensions: Sequence[str]) -> dict[str, dict[str, Any]]:
    fs, path = filesystem(pattern)
    if _glob.has_magic(path):
        found = _files(fs.glob(path, detail=True))
        if not found:
            raise SourceError(f"{pattern}: the pattern matches no file; check the path", pattern)
        return {_qualify(fs, p): info for p, info in found.items()}
    if fs.isdir(path):
        found = {p: i for p, i in _files(fs.find(path, detail=True)).items() if _is_data_file(p, extensions)}
        if not found:
            raise SourceError(f"{pattern}: the directory holds no {', '.join(extensions)} file", pattern)
        return {_qualify(fs, p): info for p, info in found.items()}
    if fs.isfile(path):
        return {_qualify(fs, path): fs.info(path)}
    raise SourceError(f"{pattern}: no such file or directory; check the path", pattern)


def expand_inputs(pattern: str) -> list[str]:
    """The files a path, directory or glob names (data files of the known formats in a directory)."""
    from .registry import EXTENSIONS

    return list(_expand(pattern, list(EXTENSIONS)))


def fingerprint(uri: str, fmt: str, info: dict[str, Any] | None = None, known: InputFile | None = None) -> InputFile:
    """``uri``'s fingerprint: size and version from ``info`` (its listing's entry) or asked
    for, and a hash of its first and last 64 KiB, read by two ranged reads (one for a small
    file; by keyword: s3fs takes a version id second). A Parquet file's footer found in that
    tail is kept for the planner.

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
    f = InputFile(uri=uri, format=fmt, size=size, version=version, digest=h.hexdigest()[:32])
    if fmt == "parquet":
        _keep_footer(f, tail)
    return f


# Parquet footers seen in the tails fingerprinting read: planning takes each file's schema
# and row groups from them instead of reading the footer twice more (on an object store,
# two requests or more per file). Bounded; make_plan empties it when it is done.
_FOOTERS: dict[tuple[str, str], bytes] = {}
_FOOTERS_LOCK = threading.Lock()
_FOOTERS_BUDGET = 64 << 20
_footers_size = 0


def _keep_footer(f: InputFile, tail: bytes) -> None:
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        return
    length = int.from_bytes(tail[-8:-4], "little") + 8
    if length > len(tail):  # the footer is not all in the tail
        return
    global _footers_size
    with _FOOTERS_LOCK:
        if _footers_size + length <= _FOOTERS_BUDGET:
            _FOOTERS[(f.uri, f.digest)] = tail[-length:]
            _footers_size += length


def parquet_footer(f: InputFile) -> bytes | None:
    """The footer (metadata, its length, ``PAR1``) of a Parquet file fingerprinted here, if kept."""
    return _FOOTERS.get((f.uri, f.digest))


def forget_footers() -> None:
    global _footers_size
    with _FOOTERS_LOCK:
        _FOOTERS.clear()
        _footers_size = 0


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
    from .registry import EXTENSIONS, detect_format

    if declared_format in ("delta", "iceberg"):
        from .tables import table_inputs

        return table_inputs(patterns, source, columns)

    found: dict[str, dict[str, Any]] = {}
    for pattern in patterns:
        found.update(_expand(pattern, list(EXTENSIONS)))
    unique = sorted(found)
    before = {f.uri: f for f in known}
    items = [(u, detect_format(u, declared_format), found[u], before.get(u)) for u in unique]
    return concurrently(lambda item: fingerprint(*item), items, unique)


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
