"""JSONL: one object per line; shards are ``shard_rows`` non-empty lines with their byte range,
so reading one seeks straight to it. A line that is not a JSON object, lacks a column or
holds a value of the wrong type is an error row, not a failed file."""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from ..core.schema import fit_value
from ..core.storage import read_range
from .encoding import check_utf8, decoded, open_text_head, scan_stream
from .linescan import cut_spans, line_ends
from .shard import MAX_RECORD_BYTES, BadRow, InputFile, Shard, Span, check_file_columns, numbered

__all__ = ["HEAD_BYTES", "JsonlFormat", "json_lines", "lines", "plan_lines"]

HEAD_BYTES = 1 << 20
"""How much of a line-format file its head is (column names and types are settled from it)."""


class JsonlFormat:
    name = "jsonl"
    extensions: tuple[str, ...] = (".jsonl", ".ndjson", ".json")

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        return plan_lines(f, shard_rows, max_record)

    def head_schema(self, f: InputFile) -> pa.Schema:
        objects = []
        seen = 0
        with open_text_head(f.uri, f.encoding) as fh:  # whole records, however long, until HEAD_BYTES of them
            for line, size in lines(fh, MAX_RECORD_BYTES):
                seen += size
                with contextlib.suppress(ValueError):
                    obj = json.loads(line) if line is not None and line.strip() else None
                    if isinstance(obj, dict):
                        objects.append(obj)
                if seen >= HEAD_BYTES and objects:
                    break
        names = list(dict.fromkeys(k for obj in objects for k in obj))
        return pa.schema([(n, _json_type([obj.get(n) for obj in objects])) for n in names])

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        return _read_jsonl(shard, columns, batch_rows, bad, types)


def lines(fh: Any, limit: int) -> Iterator[tuple[bytes | None, int]]:
    """Every line of a binary file with its size in bytes; a line over ``limit`` bytes is
    ``None`` (skipped in chunks, never held in memory)."""
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = fh.readline(1 << 20)
            if not line:
                break
            size += len(line)
        yield None, size


def plan_lines(
    f: InputFile, shard_rows: int, max_record: int, on_line: Callable[[int, bytes], None] | None = None
) -> list[Span]:
    """Spans of ``shard_rows`` non-empty lines with their byte ranges; a line over
    ``max_record`` bytes is a span of its own, ``oversized``. ``on_line(row, line)`` sees
    every other line (an OpenAI batch file's custom_ids)."""
    with scan_stream(f.uri, f.encoding) as (fh, to_source):
        spans = _line_spans(fh, f.uri, shard_rows, max_record, on_line)
        return [s._replace(offset=to_source(s.offset or 0), end=to_source(s.end or 0)) for s in spans]


def _line_spans(
    fh: Any, uri: str, shard_rows: int, max_record: int, on_line: Callable[[int, bytes], None] | None
) -> list[Span]:
    if on_line is None:  # only the line ends are needed: the vectorised scan
        return cut_spans(line_ends(fh, max_record, uri), shard_rows, max_record)
    spans: list[Span] = []
    rows = start_row = pos = start_off = 0
    for line, size in lines(fh, max_record):
        pos += size
        if line is None:  # over the limit: it alone, between the spans around it
            if rows > start_row:
                spans.append(Span(start_row, rows, start_off, pos - size))
            spans.append(Span(rows, rows + 1, pos - size, pos, oversized=True))
            rows += 1
            start_row, start_off = rows, pos
            continue
        check_utf8(line, pos - size, uri)
        if not line.strip():
            continue
        if on_line is not None:
            on_line(rows, line)
        rows += 1
        if rows - start_row == shard_rows:
            spans.append(Span(start_row, rows, start_off, pos))
            start_row, start_off = rows, pos
    if rows > start_row:
        spans.append(Span(start_row, rows, start_off, pos))
    return spans


def _json_type(values: list[Any]) -> pa.DataType:
    """The type of a JSON field's values; when they are of mixed kinds, the most common
    kind's (numbers count together), so the odd value out becomes an error row."""
    try:
        return pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        kinds = Counter("number" if isinstance(v, int | float) and not isinstance(v, bool) else type(v).__name__
                        for v in values if v is not None)  # fmt: skip
        major = kinds.most_common(1)[0][0]
        if major == "number":
            return pa.float64() if any(isinstance(v, float) for v in values) else pa.int64()
        return pa.array([v for v in values if v is not None and type(v).__name__ == major]).type


def json_lines(shard: Shard, data: bytes, bad: BadRow, hint: str = "") -> Iterator[tuple[int, Any]]:
    """The parsed lines of ``shard`` in ``data`` (its byte range) with their row numbers; a line
    that is not JSON is a bad row (``hint`` says what a line should be)."""
    n = shard.base if shard.base is not None else shard.start
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        row, n = n, n + 1
        if not shard.start <= row < shard.stop:
            continue
        try:
            yield row, json.loads(line)
        except ValueError as exc:
            bad(row, f"invalid JSON ({exc}){hint}")


def _jsonl_slow(
    shard: Shard, data: bytes, columns: Sequence[str], bad: BadRow, types: Mapping[str, pa.DataType]
) -> tuple[pa.Table, np.ndarray]:
    """Line by line: invalid JSON, non-object lines and values of the wrong type (for the
    column's type in this job; else the kind most of the shard's values have) become bad rows."""
    good: list[dict[str, Any]] = []
    rows: list[int] = []
    for row, obj in json_lines(shard, data, bad):
        if not isinstance(obj, dict):
            bad(row, f"expected a JSON object, got {type(obj).__name__}")
            continue
        missing = [c for c in columns if c not in obj]
        if missing:
            bad(row, f"missing field {missing[0]!r}")
            continue
        good.append(obj)
        rows.append(row)
    keep = np.ones(len(good), dtype=bool)
    for col in columns:
        for i, why in _misfits(good, col, types.get(col)):
            if keep[i]:
                keep[i] = False
                bad(rows[i], why)
    good = [g for g, k in zip(good, keep, strict=True) if k]
    kept_rows = np.array(rows, dtype=np.int64)[keep]
    arrays = [pa.array([g[col] for g in good], type=types.get(col)) for col in columns]
    return pa.Table.from_arrays(arrays, names=list(columns)), kept_rows


def _misfits(good: list[dict[str, Any]], col: str, want: pa.DataType | None) -> Iterator[tuple[int, str]]:
    """The objects whose ``col`` does not fit: not of the column's type in this job (``want``;
    the objects that fit take the converted value), else not of the kind most objects have."""
    values = [g[col] for g in good]
    if want is not None:
        for i, v in enumerate(values):
            try:
                good[i][col] = fit_value(v, want)
            except ValueError:
                yield i, f"field {col!r} is {type(v).__name__}, expected {want}"
        return
    kinds = Counter(type(v).__name__ for v in values if v is not None)
    if len(kinds) > 1 and not set(kinds) <= {"int", "float"}:
        major = kinds.most_common(1)[0][0]
        for i, v in enumerate(values):
            if v is not None and type(v).__name__ != major:
                yield i, f"field {col!r} is {type(v).__name__}, expected {major}"


def _read_jsonl(
    shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    data = decoded(read_range(shard), shard.encoding, shard.uri, shard.offset or 0)
    try:
        schema = pa.schema([(c, types[c]) for c in columns if c in types])
        parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
        table = pajson.read_json(io.BytesIO(data), parse_options=parse)
        check_file_columns(shard.uri, table.schema, columns)
    except pa.ArrowInvalid:
        table, rows = _jsonl_slow(shard, data, columns, bad, types)
        for b in table.to_batches(max_chunksize=batch_rows):
            yield numbered(b, rows[: b.num_rows])
            rows = rows[b.num_rows :]
        return
    skip = shard.start - (shard.base if shard.base is not None else shard.start)
    table = table.select(list(columns)).slice(skip, shard.num_rows)
    yield from table.to_batches(max_chunksize=batch_rows)
