"""CSV: shards carry byte ranges like JSONL. A record is a non-empty line, or several when a
quoted value holds line breaks; most files are cut by a vectorised scan of line ends, one
with line breaks inside quotes by the csv module. A record with too many or too few
fields is an error row; a quote never closed fails the file with the byte."""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache, partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from ..core.errors import SourceError
from ..core.storage import filesystem, read_range
from .encoding import check_utf8, decoded, not_in_encoding, open_text_head, scan_stream
from .linescan import cut_spans, next_lines, skip_line
from .shard import MAX_RECORD_BYTES, BadRow, InputFile, Shard, Span, check_file_columns, numbered, slices

__all__ = ["CsvFormat"]


class CsvFormat:
    name = "csv"
    extensions: tuple[str, ...] = (".csv",)

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        return _plan_csv(f, shard_rows, max_record)

    def head_schema(self, f: InputFile) -> pa.Schema:
        return _csv_reader(f.uri, f.encoding).schema

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        return _read_csv(shard, columns, batch_rows, bad, types)


class _RaggedRows:
    """pyarrow's handler for CSV rows with too many or too few fields: skip each, and keep
    its row number and what was wrong, so the row becomes an error row instead of failing
    the file. Row numbers are ``base`` plus pyarrow's count of records before it (empty
    lines do not count; pyarrow numbers from 1 when it is given the column names)."""

    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.rows: list[int] = []
        self.messages: dict[int, str] = {}

    def __call__(self, row: Any) -> str:
        if row.number is None:  # pyarrow did not know where it was: fail the shard
            return "error"
        number = self.base + int(row.number) - 1
        self.rows.append(number)
        text = row.text if len(row.text) <= 80 else row.text[:77] + "..."
        self.messages[number] = f"CSV row has {row.actual_columns} fields, expected {row.expected_columns}: {text}"
        return "skip"


def _csv_reader(uri: str, codec: str | None = None) -> pacsv.CSVStreamingReader:
    """A reader from the file's first character (after a byte-order mark; as UTF-8): for its
    header. Blocks are quote-aware (a quoted value may hold line breaks), and grow until the
    first records fit in one: a first record of many MB is a record like any other."""
    fs, path = filesystem(uri)
    size = int(fs.info(path).get("size") or 0)
    block = 1 << 20
    parse = pacsv.ParseOptions(invalid_row_handler=lambda _row: "skip", newlines_in_values=True)
    while True:
        opts = pacsv.ReadOptions(block_size=block, use_threads=False)
        try:
            with open_text_head(uri, codec) as fh:
                reader = pacsv.open_csv(fh, read_options=opts, parse_options=parse)
                _header_names(reader, uri, codec)
                return reader
        except pa.ArrowInvalid as exc:
            if "straddl" in str(exc) and block <= size:
                block *= 4
                continue
            raise SourceError(f"{uri}: malformed CSV ({exc}); fix or remove the file", uri) from exc
        except OSError as exc:
            raise SourceError(f"{uri}: malformed CSV ({exc}); fix or remove the file", uri) from exc


def _header_names(reader: pacsv.CSVStreamingReader, uri: str, codec: str | None) -> list[str]:
    """The column names; a header whose bytes are not UTF-8 fails the file with the first such byte."""
    try:
        return list(reader.schema.names)
    except UnicodeDecodeError:
        with open_text_head(uri, codec) as fh:  # the header is the first record: the bad byte is in the first lines
            head = fh.read(MAX_RECORD_BYTES)
        check_utf8(head, 0, uri, head.rfind(b"\n") + 1 or None)
        raise not_in_encoding(uri, 0, None, codec) from None


def _csv_header(uri: str, codec: str | None = None) -> list[str]:
    """The file's column names, read once per version of the file (every shard needs them)."""
    fs, path = filesystem(uri)
    info = fs.info(path)
    return list(_csv_header_of(uri, codec, info.get("size"), str(info.get("mtime") or info.get("LastModified") or "")))


@lru_cache(maxsize=256)
def _csv_header_of(uri: str, codec: str | None, _size: int | None, _mtime: str) -> tuple[str, ...]:
    return tuple(_csv_reader(uri, codec).schema.names)


def _plan_csv(f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
    """Shards of ``shard_rows`` records with the byte range of each, like JSONL: a record is
    a non-empty line, or several when a quoted value holds line breaks; ragged records
    count (they become error rows), and a record over ``max_record`` bytes is a span of its
    own, ``oversized`` (an error row, never parsed). Most files are cut by a vectorised scan
    of line ends, which skips an over-long line without holding it; one with line breaks
    inside quotes goes through the csv module, which knows quoting."""
    scans = (
        partial(_record_ends_plain, limit=max_record),
        _record_ends_quoted,
        partial(_record_ends_quoted, strict=False),
    )
    with scan_stream(f.uri, f.encoding) as (fh, to_source):
        start = fh.tell()
        for scan in scans:
            fh.seek(start)
            with contextlib.suppress(_LinesAreNotRecords):  # the next scan knows more CSV
                spans = cut_spans(scan(fh, f.uri), shard_rows, max_record, header=True)
                return [s._replace(offset=to_source(s.offset or 0), end=to_source(s.end or 0)) for s in spans]
    raise AssertionError("the lenient scan accepts every file it does not refuse")


class _LinesAreNotRecords(Exception):
    """A quoted value holds a line break, or a quote stands where CSV does not allow one."""


_COMMA, _QUOTE, _CR, _LF = 44, 34, 13, 10


def _record_ends_plain(fh: Any, uri: str, limit: int = MAX_RECORD_BYTES) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Byte offsets after the non-empty lines (CRLF or LF) and their sizes, a chunk at a time, for files
    whose lines are their records: every quote opens or closes a field (or is doubled
    inside one) and no line break falls between an opening and a closing quote. Raises
    :class:`_LinesAreNotRecords` otherwise. A line still open past ``limit`` bytes is
    read on to its end a chunk at a time and let go (the planner makes it an error row)."""
    base, carry, quotes = 0, b"", 0
    while True:
        if len(carry) > limit:  # a line over the limit: find its end without holding it
            quotes += carry.count(b'"')
            end = skip_line(fh)
            quotes += end[1]
            if quotes % 2:
                raise _LinesAreNotRecords  # a quoted value spans lines: the csv module decides
            size = len(carry) + end[0]
            base, carry = base + size, b""
            yield np.asarray([base], dtype=np.int64), np.asarray([size], dtype=np.int64)
            continue
        got = next_lines(fh, carry)
        if got is None:
            return
        chunk, buf, data, stops = got
        done = int(stops[-1]) if len(stops) else 0
        check_utf8(buf, base, uri, done)
        # bytes.find is a memchr: most files have no carriage return, many no quote, and skip the array passes
        none = np.empty(0, dtype=np.intp)
        cr = np.flatnonzero(data[:done] == _CR) if buf.find(b"\r", 0, done) >= 0 else none
        if len(cr) and ((cr + 1 >= len(data)) | (data[np.minimum(cr + 1, len(data) - 1)] != _LF)).any():
            raise _LinesAreNotRecords  # (fine inside a quoted value: the csv module decides)
        at = np.flatnonzero(data[:done] == _QUOTE) if buf.find(b'"', 0, done) >= 0 else none
        if len(at):
            prev = data[np.maximum(at - 1, 0)]
            nxt = data[np.minimum(at + 1, len(buf) - 1)]
            legal = (at == 0) | (prev == _COMMA) | (prev == _LF) | (prev == _QUOTE)
            legal |= (nxt == _COMMA) | (nxt == _LF) | (nxt == _QUOTE) | (nxt == _CR)
            legal |= at + 1 == len(buf)
            open_at_break = (quotes + np.searchsorted(at, stops - 1)) % 2 == 1
            if not legal.all() or open_at_break.any():
                raise _LinesAreNotRecords
            quotes += len(at)
        begins = np.concatenate(([0], stops[:-1]))
        length = stops - begins
        empty = (length == 1) | ((length == 2) & (data[np.minimum(begins, len(buf) - 1)] == _CR))
        yield base + stops[~empty], length[~empty]
        base, carry = base + done, buf[done:]
        if not chunk:
            return


def _record_ends_quoted(fh: Any, uri: str, strict: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Byte offsets after the non-empty records and their sizes, quoting understood (csv
    module), in chunks.
    A quote still open at the end of the file fails the file (it would swallow every
    record after it); ``strict`` also refuses text after a closing quote (``"a"b``), so
    the planner retries those files leniently, as pyarrow reads them."""
    pos = last = 0
    csv.field_size_limit(1 << 30)  # long texts are fine (the default stops at 128 KiB)

    def lines() -> Iterator[str]:
        nonlocal pos
        for line in fh:
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                check_utf8(line, pos, uri)  # raises, naming the byte
                raise
            pos += len(line)
            yield text

    ends: list[int] = []
    sizes: list[int] = []
    try:
        for record in csv.reader(lines(), strict=strict):
            if record:
                ends.append(pos)
                sizes.append(pos - last)
                if len(ends) == 65536:
                    yield np.asarray(ends, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
                    ends, sizes = [], []
            last = pos
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            raise SourceError(
                f"{uri}: the quoted value in the record at byte {last} is never closed; close the quote or remove "
                "the file",
                uri,
            ) from None
        if "new-line character" in str(exc):
            raise SourceError(
                f"{uri}: near byte {pos} a line ends with a lone carriage return (old Mac format); convert line "
                "ends to \\n",
                uri,
            ) from None
        if strict:
            raise _LinesAreNotRecords from None
        raise SourceError(f"{uri}: malformed CSV near byte {pos} ({exc}); fix or remove the file", uri) from exc
    yield np.asarray(ends, dtype=np.int64), np.asarray(sizes, dtype=np.int64)


def _read_csv(
    shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    """The shard's byte range parsed by pyarrow with the header's column names, the job's
    column types asked of pyarrow directly; if a value does not fit them, the range is
    parsed again with those columns as text, and :func:`read_shard` fails only the rows
    whose values do not convert."""
    names = _csv_header(shard.uri, shard.encoding)
    data = decoded(read_range(shard), shard.encoding, shard.uri, shard.offset or 0)
    check_file_columns(shard.uri, pa.schema([(n, pa.string()) for n in names]), columns)
    wanted = {c: t for c, t in types.items() if c in columns}
    only = list(columns)  # the other columns are parsed (for field counts) but not converted
    try:
        convert = pacsv.ConvertOptions(column_types=wanted, include_columns=only)
        batches = _parse_csv_range(shard, data, names, columns, convert, bad)
    except pa.ArrowInvalid:
        text = {c: pa.string() for c in wanted}
        as_text = pacsv.ConvertOptions(column_types=text, strings_can_be_null=True, include_columns=only)
        batches = _parse_csv_range(shard, data, names, columns, as_text, bad)
    for batch in batches:
        yield from slices(batch, batch_rows)


def _parse_csv_range(
    shard: Shard, data: bytes, names: list[str], columns: Sequence[str], convert: pacsv.ConvertOptions, bad: BadRow
) -> list[pa.RecordBatch]:
    """Every batch of the shard, numbered; ragged records go to ``bad`` with their numbers
    and the others are numbered around them (pyarrow reports a block's ragged rows before
    yielding it). Whole before anything is yielded, so a conversion error can start over."""
    base = shard.base if shard.base is not None else shard.start
    ragged = _RaggedRows(base)
    # the range is in memory already: one block holds any record, however long (see _csv_reader)
    opts = pacsv.ReadOptions(column_names=names, block_size=max(1 << 22, len(data) + 1), use_threads=False)
    parse = pacsv.ParseOptions(invalid_row_handler=ragged, newlines_in_values=True)
    reader = pacsv.open_csv(io.BytesIO(data), read_options=opts, parse_options=parse, convert_options=convert)
    out = []
    next_row = base
    for batch in reader:
        skipped = np.asarray([r for r in ragged.rows if r >= next_row], dtype=np.int64)
        candidates = np.arange(next_row, next_row + batch.num_rows + len(skipped))
        rows = candidates[~np.isin(candidates, skipped)][: batch.num_rows]
        if batch.num_rows:
            next_row = int(rows[-1]) + 1
        first, keep = np.searchsorted(rows, [shard.start, shard.stop])
        if keep > first:
            out.append(numbered(batch.select(list(columns)).slice(first, keep - first), rows[first:keep]))
        if keep < batch.num_rows:
            break
    for row in ragged.rows:  # once the parse has succeeded
        if shard.start <= row < shard.stop:
            bad(row, ragged.messages[row])
    return out
