"""Where results go: the sink lifecycle (``base``) and the file sink (``files``: a local or
shared folder, Parquet/JSONL/CSV parts renamed into place)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
    "make_sink",
    "part_name",
    "serialize",
    "write_bytes",
    "write_part",
]


def make_sink(cfg: JobConfig) -> FileSink:
    """The sink ``cfg.sink`` describes."""
    out_dir = Path(cfg.sink.path.removeprefix("file://")).expanduser()
    return FileSink(out_dir, cfg.sink.format, cfg.sink.compression)
