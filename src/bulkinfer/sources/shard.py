"""What every input format shares: a shard (a file's row range), the span a planner cuts,
and the :class:`Format` protocol each format module implements."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from ..core.errors import SourceError
from ..core.records import ErrorRecord

__all__ = [
    "BATCH_BYTES",
    "MAX_RECORD_BYTES",
    "ROW",
    "BadRow",
    "Format",
    "InputFile",
    "Shard",
    "ShardOutput",
    "Span",
    "check_file_columns",
    "numbered",
    "slices",
]

ROW = "__bulkinfer_row"
"""Name of the column ``read_shard`` adds: each row's number in its file (errors and resume use it)."""

BATCH_BYTES = 32 << 20
"""A record batch of pictures, tar samples or video frames is cut at this many bytes, whatever
``source.read_batch_rows`` (4,096 text rows are kilobytes; 4,096 pictures are a gigabyte, and a
window waits for its batches)."""

MAX_RECORD_BYTES = 64 << 20
"""``source.max_record_bytes``' default: a line-format record longer than this is an error row."""


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
    encoding: str | None = None
    """A line format's codec when it is not UTF-8 (a byte-order mark's, or ``source.encoding``); a
    listing of pictures: its hash (carried into its shards, whose reader checks it)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("unreadable", "encoding"):  # absent when None: the record is what it was before the fields
            if data[key] is None:
                del data[key]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputFile:
        return cls(**data)


BadRow = Callable[[int, str], None]
"""Called with a row's number and what is wrong with it; the row is skipped."""


class Span(NamedTuple):
    """Rows ``[start, stop)`` a planner cut; line formats also give the byte range ``[offset, end)``."""

    start: int
    stop: int
    offset: int | None = None
    end: int | None = None
    repeats: tuple[int, ...] = ()
    """Rows that repeat an earlier row's key (an OpenAI batch file's custom_id)."""
    oversized: bool = False
    """The span is one record over ``source.max_record_bytes``: an error row, never read."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Rows ``[start, stop)`` of one input file.

    For JSONL and CSV, ``offset``/``end`` are the byte bounds of the planned shard and
    ``base`` the row number at ``offset``; a resumed tail of a shard keeps them and moves
    ``start``. ``repeats``: rows whose key an earlier row of the file already used (an OpenAI
    batch file's duplicate custom_id), found at planning. ``oversized``: the shard is one
    record over ``source.max_record_bytes`` (an error row; its bytes are never read).
    ``encoding``: the file's codec when it is not UTF-8.
    """

    index: int
    uri: str
    format: str
    start: int
    stop: int
    offset: int | None = None
    end: int | None = None
    base: int | None = None
    repeats: tuple[int, ...] = ()
    oversized: bool = False
    encoding: str | None = None
    """The file's codec when it is not UTF-8: the shard's bytes are decoded when read. For a listing
    of pictures (format ``images``): the listing's hash, which its reader checks."""

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def to_json(self) -> dict[str, Any]:
        """Its fields, those at their defaults left out (a million shards' job.json)."""
        return {k: v for k, v in asdict(self).items() if k not in _SHARD_DEFAULTS or v != _SHARD_DEFAULTS[k]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shard:
        uri, fmt = sys.intern(data["uri"]), sys.intern(data["format"])  # one string for all a file's shards
        return cls(**{**data, "uri": uri, "format": fmt, "repeats": tuple(data.get("repeats", ()))})


_SHARD_DEFAULTS = {f.name: f.default for f in fields(Shard) if f.default is not MISSING}


class Format(Protocol):
    """One input format: how to cut a file into spans, what its head looks like, and how to
    read a shard. A new format is a module implementing this and one line in the registry."""

    name: str
    extensions: tuple[str, ...]

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        """Spans of about ``shard_rows`` rows covering every row of ``f`` once (a line format's
        record over ``max_record`` bytes: a span of its own, ``oversized``); raises
        :class:`SourceError` when the file is not readable as this format."""
        ...

    def head_schema(self, f: InputFile) -> pa.Schema:
        """The columns the file starts with and their types, read cheaply."""
        ...

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        """The shard's rows of ``columns`` in order (numbered with :data:`ROW` when rows were skipped)."""
        ...


def check_file_columns(uri: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise SourceError(f"{uri}: column {missing[0]!r} not found; the file has {', '.join(schema.names)}", uri)


def numbered(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    return batch.append_column(ROW, pa.array(rows, type=pa.int64()))


def slices(batch: pa.RecordBatch, size: int) -> Iterator[pa.RecordBatch]:
    for off in range(0, batch.num_rows, size):
        yield batch.slice(off, size)


@dataclass
class ShardOutput:
    """What a runner hands to the sink: the rows of ``shard`` (which may be a prefix of a
    planned shard) in input order, and the records of the rows that failed."""

    shard: Shard
    table: pa.Table
    errors: list[ErrorRecord] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Rows the records stand for (a range record covers several)."""
        return sum(e.rows for e in self.errors)
