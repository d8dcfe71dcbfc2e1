"""Parquet: shards follow row-group boundaries; the head is the footer's schema. A row group
larger than a shard is read once for all its shards: the reader that ends a shard inside it
keeps its place (:func:`reading_in_order`), so the next shard continues there instead of
decoding the group again from its first row."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import SourceError
from ..core.storage import path_or_file
from .shard import BadRow, InputFile, Shard, Span, check_file_columns

__all__ = ["ParquetFormat", "forget_footers", "keep_footer", "parquet_footer", "reading_in_order"]

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


# Where readers stopped inside a row group: (file, columns, batch rows, next row) -> the rest of
# that read and the row it ends at. In a job's context only (reading_in_order), and a few at a
# time: each holds one row group's decoder and at most one batch.
Place = tuple[Iterator[pa.RecordBatch], int]
_PLACES: contextvars.ContextVar[OrderedDict[tuple[object, ...], Place] | None]
_PLACES = contextvars.ContextVar("bulkinfer_parquet_places", default=None)
_PLACES_LOCK = threading.Lock()
PLACES_KEPT = 4


@contextlib.contextmanager
def reading_in_order() -> Iterator[None]:
    """For the block (a job; the threads it starts through :mod:`bulkinfer.core.threads` too): a
    shard that ends inside a row group leaves its reader there for the shard that starts where
    it ended. Outside such a block every shard is read on its own."""
    token = _PLACES.set(OrderedDict())
    try:
        yield
    finally:
        _PLACES.reset(token)


def _taken(key: tuple[object, ...], stop: int) -> Place | None:
    """The reader left at ``key``, when it reads on at least to ``stop``."""
    places = _PLACES.get()
    if places is None:
        return None
    with _PLACES_LOCK:
        place = places.pop(key, None)
    return place if place is not None and stop <= place[1] else None


def _kept(key: tuple[object, ...], place: Place) -> None:
    places = _PLACES.get()
    if places is None:
        return
    with _PLACES_LOCK:
        places[key] = place
        while len(places) > PLACES_KEPT:
            places.popitem(last=False)


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
        key = (shard.uri, tuple(columns), batch_rows)
        skip, place = 0, _taken((*key, shard.start), shard.stop)
        if place is None:
            batches, end, skip = _from_group_start(shard, columns, batch_rows)
        else:
            batches, end = place
        remaining = shard.num_rows
        for batch in batches:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            out = batch.slice(skip, remaining)
            rest = batch.slice(skip + out.num_rows)
            skip = 0
            remaining -= out.num_rows
            if remaining <= 0:
                if shard.stop < end:  # the row groups read on: the next shard's reader continues here
                    _kept((*key, shard.stop), (itertools.chain([rest], batches) if rest.num_rows else batches, end))
                yield out
                return
            yield out


def _from_group_start(
    shard: Shard, columns: Sequence[str], batch_rows: int
) -> tuple[Iterator[pa.RecordBatch], int, int]:
    """The batches of the row groups ``shard`` spans, the row they end at, and the rows before
    its start in them."""
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
    batches = pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=list(columns))
    end = first + sum(meta.row_group(rg).num_rows for rg in groups)
    return batches, end, shard.start - first


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
