"""Where results go: the sink lifecycle (``base``) and the file sink (``files``: a local or
shared folder, Parquet/JSONL/CSV parts renamed into place)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from .base import Part, Published, Sink, Staged, StagedOutput
from .files import ERRORS, EXTENSIONS, FileSink, part_name, serialize, write_bytes, write_part

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = [
    "ERRORS",
    "EXTENSIONS",
    "FileSink",
    "Part",
    "Published",
    "Sink",
    "Staged",
    "StagedOutput",
    "is_remote",
    "make_sink",
    "part_name",
    "serialize",
    "write_bytes",
    "write_part",
]


def make_sink(cfg: JobConfig) -> Sink:
    """The sink ``cfg.sink`` describes: a folder, or an object-store prefix (any fsspec URI)."""
    sk = cfg.sink
    if sk.format == "delta":
        if is_remote(sk.path):
            raise ConfigError("sink.format: delta writes a table in a local or shared folder, not an object store")
        from .delta import DeltaSink

        return DeltaSink(Path(sk.path.removeprefix("file://")).expanduser(), sk.compression)
    if is_remote(sk.path):
        from .objects import ObjectSink

        return ObjectSink(sk.path, sk.format, sk.compression, sk.storage_options)
    return FileSink(Path(sk.path.removeprefix("file://")).expanduser(), sk.format, sk.compression)


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URI of a filesystem other than the local one."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme != "file"
