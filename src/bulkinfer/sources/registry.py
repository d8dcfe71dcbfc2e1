"""The one table of input formats. A new format is a module implementing
:class:`~.base.Format` and one line here."""

from __future__ import annotations

from ..core.errors import SourceError
from .csv import CsvFormat
from .grids import GridFormat
from .images import ImageFilesFormat
from .jsonl import JsonlFormat
from .openai_batch import OpenAIBatchFormat
from .parquet import ParquetFormat
from .shard import Format
from .video import VideoFormat
from .webdataset import WebDatasetFormat

__all__ = ["EXTENSIONS", "FORMATS", "detect_format", "get_format"]

_ALL: tuple[Format, ...] = (
    ParquetFormat(), CsvFormat(), JsonlFormat(), OpenAIBatchFormat(),
    ImageFilesFormat(), WebDatasetFormat(), VideoFormat(), GridFormat("zarr", (".zarr",)),
    GridFormat("netcdf", (".nc", ".nc4")),
)  # fmt: skip
FORMATS: dict[str, Format] = {f.name: f for f in _ALL}

EXTENSIONS: dict[str, str] = {ext: f.name for f in FORMATS.values() for ext in f.extensions}


def get_format(name: str) -> Format:
    return FORMATS[name]


def detect_format(uri: str, declared: str) -> str:
    if declared != "auto":
        return declared
    lower = uri.lower()
    for ext, fmt in EXTENSIONS.items():
        if lower.endswith(ext):
            return fmt
    raise SourceError(f"{uri}: cannot tell the format from the extension; set source.format", uri)
