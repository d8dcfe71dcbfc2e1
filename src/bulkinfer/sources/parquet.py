"""Parquet: shards follow row-group boundaries; the head is the footer's schema."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import SourceError
from ..core.storage import path_or_file
from .shard import BadRow, InputFile, Shard, Span, check_file_columns

__all__ = ["ParquetFormat", "forget_footers", "keep_footer", "parquet_footer"]

# Parquet footers seen in the tails fingerprinting read: planning takes each file's schema
# and row groups from them instead of reading the footer twice more (on an object store,
# two requests or more per file). Bounded; make_plan empties it when it is done.
_FOOTERS: dict[tuple[str, str], bytes] = {}
_FOOTERS_LOCK = threading.Lock()
_FOOTERS_BUDGET = 64 << 20
_footers_size = 0


def keep_footer(f: InputFile, tail: bytes) -> None:
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


class ParquetFormat:
    name = "parquet"
    extensions: tuple[str, ...] = (".parquet", ".pq")

    def plan(self, f: InputFile, shard_rows: int, max_record: int = 0) -> list[Span]:
        try:
            meta = _parquet_file(f).metadata
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{f.uri}: not a readable Parquet file ({exc}); rewrite or remove it", f.uri) from exc
        spans: list[Span] = []
        start = cur = 0
        for rg in range(meta.num_row_groups):
            n = meta.row_group(rg).num_rows
            if cur > start and cur - start + n > shard_rows:
                spans.append(Span(start, cur))
                start = cur
            cur += n
            while cur - start > shard_rows:
                spans.append(Span(start, start + shard_rows))
                start += shard_rows
        if cur > start:
            spans.append(Span(start, cur))
        return spans

    def head_schema(self, f: InputFile) -> pa.Schema:
        return _parquet_file(f).schema_arrow

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        pf = pq.ParquetFile(path_or_file(shard.uri))
        check_file_columns(shard.uri, pf.schema_arrow, columns)
        meta = pf.metadata
        groups: list[int] = []
        first = cur = 0
        for rg in range(meta.num_row_groups):
            n = meta.row_group(rg).num_rows
            if cur + n > shard.start and cur < shard.stop:
                if not groups:
                    first = cur
                groups.append(rg)
            cur += n
        skip, remaining = shard.start - first, shard.num_rows
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=list(columns)):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            batch = batch.slice(skip, remaining)
            skip = 0
            remaining -= batch.num_rows
            yield batch
            if remaining <= 0:
                return


def _parquet_file(f: InputFile) -> pq.ParquetFile:
    """``f`` opened for its metadata: from the footer fingerprinting kept when it did (no
    read at all), else from the file."""
    footer = parquet_footer(f)
    if footer is not None:
        try:
            return pq.ParquetFile(pa.BufferReader(b"PAR1" + footer))
        except (pa.ArrowInvalid, OSError):
            pass  # the file says why, below
    return pq.ParquetFile(path_or_file(f.uri))
