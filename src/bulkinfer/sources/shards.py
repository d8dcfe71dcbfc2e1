"""Cut files into shards and read a shard back as numbered Arrow batches.

Planning is deterministic: files sorted by URI, each cut by its format's planner. Rows are
numbered by record (empty lines do not count); a row that cannot be parsed or whose value
does not fit its column's type is reported to ``on_bad_row``, not a failed file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.errors import SourceError
from ..core.schema import convert_rows
from ..core.tensors import unsliced
from .registry import get_format
from .shard import MAX_RECORD_BYTES, ROW, BadRow, InputFile, Shard, numbered
from .shardtable import ShardTable

__all__ = ["plan_shards", "read_shard"]

_SIZED_WHEN_READ = frozenset({"webdataset"})
"""Formats with byte ranges whose records are sized as they are read (a tar's members), not at
planning as a line format's are."""


def plan_shards(
    files: Sequence[InputFile],
    shard_rows: int,
    problems: list[SourceError] | None = None,
    max_record: int = MAX_RECORD_BYTES,
) -> ShardTable:
    """Cut every file into shards of about ``shard_rows`` rows; shards cover each row exactly once.

    A file that cannot be planned (unreadable, truncated, not the format it claims) raises
    :class:`SourceError`, or, when ``problems`` is a list, is skipped and its error appended.
    Empty files have no shards.
    """
    from ..core.storage import concurrently

    def spans_of(f: InputFile) -> list[Any] | SourceError:
        try:
            if f.unreadable is not None:
                raise SourceError(f"{f.uri}: cannot read the file ({f.unreadable}); check its permissions", f.uri)
            return list(get_format(f.format).plan(f, shard_rows, max_record))
        except (SourceError, OSError) as exc:
            return exc if isinstance(exc, SourceError) else SourceError(f"{f.uri}: cannot read the file ({exc})", f.uri)

    present = [f for f in files if f.size != 0]
    planned = concurrently(spans_of, present, [f.uri for f in present])  # an object store's footers: concurrently
    shards = ShardTable()
    for f, spans in zip(present, planned, strict=True):
        if isinstance(spans, SourceError):
            if problems is None:
                raise spans
            problems.append(spans)
            continue
        for span in spans:
            base = span.start if span.offset is not None else None
            shard = Shard(
                len(shards), f.uri, f.format, span.start, span.stop, span.offset, span.end, base, span.repeats,
                span.oversized, f.encoding,
            )  # fmt: skip
            shards.append(shard)
    return shards


def _drop_oversized(batch: pa.RecordBatch, columns: Sequence[str], limit: int, bad: BadRow) -> pa.RecordBatch:
    """The batch without its rows whose text and binary values add up to over ``limit``
    bytes; each of those is reported to ``bad`` with its size."""
    sizes = None
    for c in columns:
        col = batch.column(c)
        t = col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            n = pc.fill_null(pc.binary_length(col), 0).cast(pa.int64())
            sizes = n if sizes is None else pc.add(sizes, n)
    if sizes is None:
        return batch
    over = pc.greater(sizes, limit)
    if not pc.any(over).as_py():
        return batch
    rows = batch.column(ROW).to_numpy()
    for i in np.flatnonzero(over.to_numpy(zero_copy_only=False)):
        size = sizes[int(i)].as_py()
        bad(int(rows[i]), f"the record is {size} bytes, over source.max_record_bytes; split it or raise the limit")
    return batch.filter(pc.invert(over))


def read_shard(
    shard: Shard,
    columns: Sequence[str],
    batch_rows: int = 4096,
    on_bad_row: BadRow | None = None,
    types: Mapping[str, pa.DataType] | None = None,
    max_record: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the shard's rows, in order, as record batches of ``columns`` plus :data:`ROW`,
    each column of ``types`` converted to its type there.

    Rows that cannot be parsed (a JSONL line, a ragged CSV record), whose value does not
    fit the column's type, or (columnar files) whose text and binary values in ``columns``
    add up to more than ``max_record`` bytes are skipped and reported to
    ``on_bad_row(row, message)``; without it they raise :class:`SourceError`. (Line formats
    meet ``max_record`` at planning: an over-long record is an ``oversized`` shard.)
    """
    types = types or {}

    def bad(row: int, message: str) -> None:
        if on_bad_row is None:
            raise SourceError(f"{shard.uri}: row {row}: {message}", shard.uri)
        on_bad_row(row, message)

    if shard.oversized:  # one record over source.max_record_bytes: never read
        size = (shard.end or 0) - (shard.offset or 0)
        bad(shard.start, f"the record is {size} bytes, over source.max_record_bytes; split it or raise the limit")
        return
    next_row = shard.start
    try:
        for read in get_format(shard.format).read(shard, columns, batch_rows, bad, types):
            batch = unsliced(read)
            if ROW not in batch.schema.names:
                batch = numbered(batch, np.arange(next_row, next_row + batch.num_rows))
            if batch.num_rows:
                next_row = int(batch.column(ROW)[-1].as_py()) + 1
            if max_record is not None and (shard.offset is None or shard.format in _SIZED_WHEN_READ):
                batch = _drop_oversized(batch, columns, max_record, bad)
            if any(c in types and batch.schema.field(c).type != types[c] for c in columns):
                table, _rows = convert_rows(pa.Table.from_batches([batch]), types, batch.column(ROW).to_numpy(), bad)
                if not table.num_rows:
                    continue
                batch = table.combine_chunks().to_batches()[0]
            yield batch
    except FileNotFoundError as exc:
        raise SourceError(f"{shard.uri}: the file disappeared after planning; restore it and rerun", shard.uri) from exc
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{shard.uri}: cannot read rows {shard.start}-{shard.stop} ({exc})", shard.uri) from exc
