"""Storage I/O for every module that reads or writes by URI: a local path or any fsspec URI
(S3, GCS, Azure, HTTP, ...), opened with the job's ``source.storage_options`` for the stores
its inputs name. A leaf: it imports nothing of bulkinfer's but the errors and its threads."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .errors import SourceError
from .threads import pool

__all__ = [
    "concurrently",
    "file_version",
    "files_only",
    "filesystem",
    "is_remote",
    "listed_version",
    "open_binary",
    "options_for",
    "path_or_file",
    "read_range",
    "read_whole",
    "storage_options_for",
    "store_trouble",
    "use_storage_options",
]

# source.storage_options by protocol: every input (and the previous output of an incremental
# run) on that store opens with them. A job's are in its context (storage_options_for: the
# threads it starts through core.threads carry them), so jobs sharing a process each see their
# own; a process that runs one job (a Ray worker, tune) may set them for itself instead.
_SCOPED: contextvars.ContextVar[Mapping[str, dict[str, Any]]] = contextvars.ContextVar("bulkinfer_storage_options")
_PROCESS: dict[str, dict[str, Any]] = {}


def _by_protocol(options: Mapping[str, Any], paths: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in paths if options else ():
        protocol = fsspec.core.split_protocol(p)[0]
        if protocol and protocol != "file":
            out[protocol] = dict(options)
    return out


def use_storage_options(options: dict[str, Any], paths: Sequence[str]) -> None:
    """For a process that runs one job (a Ray worker, ``bulkinfer tune``): open the stores
    ``paths`` name with ``options`` from now on, where no job's own (:func:`storage_options_for`)
    are in force."""
    _PROCESS.clear()
    _PROCESS.update(_by_protocol(options, paths))


@contextlib.contextmanager
def storage_options_for(options: dict[str, Any], paths: Sequence[str]) -> Iterator[None]:
    """Open the stores ``paths`` name with ``options`` in this block: in this thread and the
    threads it starts through :mod:`.threads` only (a job's inputs; within it, the output of an
    earlier run read with ``sink.storage_options``). The stores it does not name keep theirs."""
    token = _SCOPED.set({**_SCOPED.get({}), **_by_protocol(options, paths)})
    try:
        yield
    finally:
        _SCOPED.reset(token)


def options_for(uri: str) -> dict[str, Any]:
    """The storage options ``uri`` opens with here: the job's own, else this process's, else none."""
    protocol = fsspec.core.split_protocol(uri)[0] or ""
    return _SCOPED.get({}).get(protocol, _PROCESS.get(protocol, {}))


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri, **options_for(uri))
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
    except Exception as exc:  # the store's client raised it: no credentials, a bad endpoint...
        raise store_trouble(where, exc) from exc
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


def store_trouble(where: str, exc: Exception) -> SourceError:
    """One line for a store that cannot be reached or refuses (no credentials, a wrong
    endpoint, access denied): whatever the client library raised, no traceback."""
    why = " ".join(str(exc).split())[:200] or type(exc).__name__
    return SourceError(
        f"{where}: cannot read it ({type(exc).__name__}: {why}); check the path, and the store's endpoint and "
        "credentials (source.storage_options, or the environment)",
        where,
    )


def file_version(path: Path) -> tuple[int, int, int]:
    """Which write of ``path`` is there (a manifest or an index replaced by a later run): a
    rewrite within the filesystem's clock resolution, one or two seconds on some network
    filesystems, still differs in inode or size."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URI of a filesystem other than the local one."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme != "file"


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
    with pool(min(PLANNING_THREADS, len(items)), "bulkinfer-plan") as threads:
        return list(threads.map(fn, items))


def files_only(fs: Any, found: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The files of a listing (``find``/``glob`` with ``detail=True``) by path. A symbolic link
    to a file counts as the file (its size and time are the target's): a local listing calls it
    ``other``, and skipping it would silently leave a linked input out."""
    out = {}
    for path, info in found.items():
        kind = info.get("type", "file")
        if kind == "file":
            out[path] = dict(info)
        elif info.get("islink") and fs.isfile(path):
            out[path] = dict(fs.info(path))
    return out


def listed_version(info: Mapping[str, Any]) -> str:
    """Which write of a file its listing entry (or ``info``) names: the store's entity tag, else
    its modification time, else its creation time; empty when the store says none."""
    return str(
        info.get("ETag")
        or info.get("etag")
        or info.get("mtime")
        or info.get("LastModified")
        or info.get("created")
        or ""
    )
