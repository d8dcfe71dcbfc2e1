"""Input files: list them, fingerprint them, plan shards, read a shard as Arrow batches.

A shard is a (file, row range). Planning is deterministic: files sorted by URI, Parquet
shards follow row-group boundaries, CSV and JSONL shards are ``shard_rows`` rows each and
carry their byte range, so reading one seeks straight to it. Rows are numbered by record
(empty lines do not count); a row that cannot be parsed (a JSONL line that is not an
object, a CSV record with the wrong number of fields) becomes an error row, not a failed
file.
"""

from __future__ import annotations

import contextlib
import csv
import glob as _glob
import hashlib
import io
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from .errors import SourceError
from .schema import convert_rows, fit_value, unify

__all__ = [
    "ROW",
    "InputFile",
    "Shard",
    "check_columns",
    "detect_format",
    "head_schema",
    "list_inputs",
    "plan_shards",
    "read_shard",
    "settle_types",
]

_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
}
_HASH_BYTES = 64 * 1024


@dataclass(frozen=True)
class InputFile:
    """One input file and its fingerprint (size, mtime or etag, hash of head and tail)."""

    uri: str
    format: str
    size: int
    version: str
    digest: str


@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of one input file.

    For JSONL and CSV, ``offset``/``end`` are the byte bounds of the planned shard and
    ``base`` the row number at ``offset``; a resumed tail of a shard keeps them and moves
    ``start``.
    """

    index: int
    uri: str
    format: str
    start: int
    stop: int
    offset: int | None = None
    end: int | None = None
    base: int | None = None

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shard:
        return cls(**data)


def detect_format(uri: str, declared: str) -> str:
    if declared != "auto":
        return declared
    lower = uri.lower()
    for ext, fmt in _EXTENSIONS.items():
        if lower.endswith(ext):
            return fmt
    raise SourceError(f"{uri}: cannot tell the format from the extension; set source.format")


def _fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def _qualify(fs: fsspec.AbstractFileSystem, path: str) -> str:
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.unstrip_protocol(path)


def _is_data_file(path: str) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith(("_", ".")) and any(name.lower().endswith(e) for e in _EXTENSIONS)


def _expand(pattern: str) -> list[str]:
    fs, path = _fs(pattern)
    if _glob.has_magic(path):
        found = [p for p in fs.glob(path) if fs.isfile(p)]
        if not found:
            raise SourceError(f"{pattern}: the pattern matches no file; check the path")
        return [_qualify(fs, p) for p in found]
    if fs.isdir(path):
        found = [p for p in fs.find(path) if _is_data_file(p)]
        if not found:
            raise SourceError(f"{pattern}: the directory holds no .parquet, .csv or .jsonl file")
        return [_qualify(fs, p) for p in found]
    if fs.isfile(path):
        return [_qualify(fs, path)]
    raise SourceError(f"{pattern}: no such file or directory; check the path")


def _fingerprint(uri: str, fmt: str) -> InputFile:
    fs, path = _fs(uri)
    info = fs.info(path)
    size = int(info.get("size") or 0)
    try:
        version = str(
            info.get("ETag")
            or info.get("etag")
            or info.get("mtime")
            or info.get("LastModified")
            or info.get("created")
            or ""
        )
        h = hashlib.sha256()
        with fs.open(path, "rb") as f:
            h.update(f.read(_HASH_BYTES))
            if size > _HASH_BYTES:
                f.seek(max(_HASH_BYTES, size - _HASH_BYTES))
                h.update(f.read(_HASH_BYTES))
    except OSError as exc:  # planning reports it as a problem of this file; the job goes on with the others
        return InputFile(uri=uri, format=fmt, size=size, version=version, digest=f"unreadable: {exc.strerror or exc}")
    return InputFile(uri=uri, format=fmt, size=size, version=version, digest=h.hexdigest()[:32])


def list_inputs(patterns: Sequence[str], declared_format: str = "auto") -> list[InputFile]:
    """Expand paths, directories and globs into fingerprinted files, sorted, without duplicates."""
    uris: list[str] = []
    for pattern in patterns:
        uris.extend(_expand(pattern))
    unique = sorted(set(uris))
    return [_fingerprint(u, detect_format(u, declared_format)) for u in unique]


def _open_local_or_fs(uri: str) -> Any:
    fs, path = _fs(uri)
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.open(path, "rb")


def _plan_parquet(f: InputFile, shard_rows: int) -> list[tuple[int, int, int | None, int | None]]:
    try:
        meta = pq.ParquetFile(_open_local_or_fs(f.uri)).metadata
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{f.uri}: not a readable Parquet file ({exc}); rewrite or remove it") from exc
    ranges: list[tuple[int, int, int | None, int | None]] = []
    start = cur = 0
    for rg in range(meta.num_row_groups):
        n = meta.row_group(rg).num_rows
        if cur > start and cur - start + n > shard_rows:
            ranges.append((start, cur, None, None))
            start = cur
        cur += n
        while cur - start > shard_rows:
            ranges.append((start, start + shard_rows, None, None))
            start += shard_rows
    if cur > start:
        ranges.append((start, cur, None, None))
    return ranges


def _plan_jsonl(f: InputFile, shard_rows: int) -> list[tuple[int, int, int | None, int | None]]:
    fs, path = _fs(f.uri)
    ranges: list[tuple[int, int, int | None, int | None]] = []
    rows = start_row = 0
    pos = start_off = 0
    with fs.open(path, "rb") as fh:
        for line in fh:
            pos += len(line)
            if line.strip():
                rows += 1
                if rows - start_row == shard_rows:
                    ranges.append((start_row, rows, start_off, pos))
                    start_row, start_off = rows, pos
    if rows > start_row:
        ranges.append((start_row, rows, start_off, pos))
    return ranges


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


def _csv_reader(uri: str) -> pacsv.CSVStreamingReader:
    """A reader from the file's start: for its header (pyarrow strips a BOM, reads quotes)."""
    fs, path = _fs(uri)
    opts = pacsv.ReadOptions(block_size=1 << 20, use_threads=False)
    parse = pacsv.ParseOptions(invalid_row_handler=lambda _row: "skip")  # rows are checked when read
    try:
        return pacsv.open_csv(fs.open(path, "rb"), read_options=opts, parse_options=parse)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{uri}: malformed CSV ({exc}); fix or remove the file") from exc


def _csv_header(uri: str) -> list[str]:
    """The file's column names, read once per version of the file (every shard needs them)."""
    fs, path = _fs(uri)
    info = fs.info(path)
    return list(_csv_header_of(uri, info.get("size"), str(info.get("mtime") or info.get("LastModified") or "")))


@lru_cache(maxsize=256)
def _csv_header_of(uri: str, _size: int | None, _mtime: str) -> tuple[str, ...]:
    return tuple(_csv_reader(uri).schema.names)


_CHUNK = 1 << 24


def _plan_csv(f: InputFile, shard_rows: int) -> list[tuple[int, int, int | None, int | None]]:
    """Shards of ``shard_rows`` records with the byte range of each, like JSONL: a record is
    a non-empty line, or several when a quoted value holds line breaks; ragged records
    count (they become error rows). Most files are cut by a vectorised scan of line ends;
    one with line breaks inside quotes goes through the csv module, which knows quoting."""
    fs, path = _fs(f.uri)
    scans = (_record_ends_plain, _record_ends_quoted, partial(_record_ends_quoted, strict=False))
    with fs.open(path, "rb") as fh:
        for scan in scans:
            fh.seek(0)
            with contextlib.suppress(_LinesAreNotRecords):  # the next scan knows more CSV
                return _cut_csv(scan(fh, f.uri), shard_rows)
    raise AssertionError("the lenient scan accepts every file it does not refuse")


def _cut_csv(chunks: Iterator[np.ndarray], shard_rows: int) -> list[tuple[int, int, int | None, int | None]]:
    """Shards from the byte offsets after each record (the header's first)."""
    ranges: list[tuple[int, int, int | None, int | None]] = []
    rows, start_off, end = 0, -1, 0
    for ends in chunks:
        if start_off < 0 and len(ends):  # the header
            start_off, ends = int(ends[0]), ends[1:]
        for k in range(rows // shard_rows + 1, (rows + len(ends)) // shard_rows + 1):
            end = int(ends[k * shard_rows - rows - 1])
            ranges.append(((k - 1) * shard_rows, k * shard_rows, start_off, end))
            start_off = end
        if len(ends):
            rows, end = rows + len(ends), int(ends[-1])
    if rows > len(ranges) * shard_rows:
        ranges.append((len(ranges) * shard_rows, rows, start_off, end))
    return ranges


class _LinesAreNotRecords(Exception):
    """A quoted value holds a line break, or a quote stands where CSV does not allow one."""


_COMMA, _QUOTE, _CR, _LF = 44, 34, 13, 10


def _record_ends_plain(fh: Any, uri: str) -> Iterator[np.ndarray]:
    """Byte offsets after the non-empty lines (CRLF or LF), a chunk at a time, for files
    whose lines are their records: every quote opens or closes a field (or is doubled
    inside one) and no line break falls between an opening and a closing quote. Raises
    :class:`_LinesAreNotRecords` otherwise."""
    base, carry, quotes = 0, b"", 0
    while True:
        chunk = fh.read(_CHUNK)
        buf = carry + chunk
        if not buf:
            return
        data = np.frombuffer(buf, dtype=np.uint8)
        stops = np.flatnonzero(data == _LF) + 1
        if not chunk and (not len(stops) or stops[-1] != len(buf)):  # last line without a line end
            stops = np.append(stops, len(buf))
        done = int(stops[-1]) if len(stops) else 0
        cr = np.flatnonzero(data[:done] == _CR)
        if len(cr) and ((cr + 1 >= len(data)) | (data[np.minimum(cr + 1, len(data) - 1)] != _LF)).any():
            raise _LinesAreNotRecords  # (fine inside a quoted value: the csv module decides)
        at = np.flatnonzero(data[:done] == _QUOTE)
        if len(at):
            prev = data[np.maximum(at - 1, 0)]
            nxt = data[np.minimum(at + 1, len(buf) - 1)]
            legal = (at == 0) | np.isin(prev, (_COMMA, _LF, _QUOTE)) | np.isin(nxt, (_COMMA, _CR, _LF, _QUOTE))
            legal |= at + 1 == len(buf)
            open_at_break = (quotes + np.searchsorted(at, stops - 1)) % 2 == 1
            if not legal.all() or open_at_break.any():
                raise _LinesAreNotRecords
            quotes += len(at)
        begins = np.concatenate(([0], stops[:-1]))
        length = stops - begins
        empty = (length == 1) | ((length == 2) & (data[np.minimum(begins, len(buf) - 1)] == _CR))
        yield base + stops[~empty]
        base, carry = base + done, buf[done:]
        if not chunk:
            return


def _record_ends_quoted(fh: Any, uri: str, strict: bool = True) -> Iterator[np.ndarray]:
    """Byte offsets after the non-empty records, quoting understood (csv module), in chunks.
    A quote still open at the end of the file fails the file (it would swallow every
    record after it); ``strict`` also refuses text after a closing quote (``"a"b``), so
    the planner retries those files leniently, as pyarrow reads them."""
    pos = last = 0
    csv.field_size_limit(1 << 30)  # long texts are fine (the default stops at 128 KiB)

    def lines() -> Iterator[str]:
        nonlocal pos
        for line in fh:
            pos += len(line)
            yield line.decode("utf-8", "surrogateescape")

    ends: list[int] = []
    try:
        for record in csv.reader(lines(), strict=strict):
            if record:
                ends.append(pos)
                if len(ends) == 65536:
                    yield np.asarray(ends, dtype=np.int64)
                    ends = []
            last = pos
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            raise SourceError(
                f"{uri}: the quoted value in the record at byte {last} is never closed; close the quote or remove "
                "the file"
            ) from None
        if "new-line character" in str(exc):
            raise SourceError(
                f"{uri}: near byte {pos} a line ends with a lone carriage return (old Mac format); convert line "
                "ends to \\n"
            ) from None
        if strict:
            raise _LinesAreNotRecords from None
        raise SourceError(f"{uri}: malformed CSV near byte {pos} ({exc}); fix or remove the file") from exc
    yield np.asarray(ends, dtype=np.int64)


_PLANNERS = {"parquet": _plan_parquet, "jsonl": _plan_jsonl, "csv": _plan_csv}


def plan_shards(files: Sequence[InputFile], shard_rows: int, problems: list[SourceError] | None = None) -> list[Shard]:
    """Cut every file into shards of about ``shard_rows`` rows; shards cover each row exactly once.

    A file that cannot be planned (unreadable, truncated, not the format it claims) raises
    :class:`SourceError`, or, when ``problems`` is a list, is skipped and its error appended.
    Empty files have no shards.
    """
    shards: list[Shard] = []
    for f in files:
        if f.size == 0:
            continue
        try:
            if f.digest.startswith("unreadable"):
                raise SourceError(
                    f"{f.uri}: cannot read the file ({f.digest.split(': ', 1)[-1]}); check its permissions"
                )
            ranges = _PLANNERS[f.format](f, shard_rows)
        except (SourceError, OSError) as exc:
            err = exc if isinstance(exc, SourceError) else SourceError(f"{f.uri}: cannot read the file ({exc})")
            if problems is None:
                raise err from exc
            problems.append(err)
            continue
        for start, stop, off, end in ranges:
            base = start if off is not None else None
            shards.append(Shard(len(shards), f.uri, f.format, start, stop, off, end, base))
    return shards


_HEAD_BYTES = 1 << 20


def head_schema(f: InputFile) -> pa.Schema:
    """The columns a file starts with and their types, read cheaply: Parquet's footer, the
    first MiB of a CSV as pyarrow infers it, the first MiB of JSONL lines. Empty when the
    file cannot be read (planning reports that)."""
    try:
        if f.format == "parquet":
            return pq.read_schema(_open_local_or_fs(f.uri))
        if f.format == "csv":
            return _csv_reader(f.uri).schema
        fs, path = _fs(f.uri)
        with fs.open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
            if fh.read(1):  # cut: keep whole lines
                head = head[: head.rfind(b"\n") + 1]
        objects = []
        for line in head.split(b"\n"):
            with contextlib.suppress(ValueError):
                obj = json.loads(line) if line.strip() else None
                if isinstance(obj, dict):
                    objects.append(obj)
        names = list(dict.fromkeys(k for obj in objects for k in obj))
        return pa.schema([(n, _json_type([obj.get(n) for obj in objects])) for n in names])
    except (pa.ArrowInvalid, OSError, ValueError, SourceError):
        return pa.schema([])


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


def check_columns(heads: Mapping[str, pa.Schema], columns: Sequence[str]) -> None:
    """Refuse up front when a needed column is in none of the files' heads (``{uri:
    head_schema}``): a config mistake, not bad data."""
    for col in columns:
        if heads and not any(col in schema.names for schema in heads.values()):
            example: list[str] = next((schema.names for schema in heads.values() if schema.names), [])
            raise SourceError(
                f"column {col!r} not found in any of the {len(heads)} input file(s); "
                f"they have {', '.join(example) or 'no readable columns'}"
            )


def settle_types(heads: Iterable[pa.Schema], columns: Sequence[str]) -> dict[str, pa.DataType]:
    """Each column's one type across the files whose heads are given (see :mod:`.schema`)."""
    schemas = list(heads)
    types = {}
    for col in columns:
        t = unify(schema.field(col).type for schema in schemas if col in schema.names)
        if t is not None:
            types[col] = t
    return types


def _check_columns(uri: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise SourceError(f"{uri}: column {missing[0]!r} not found; the file has {', '.join(schema.names)}")


ROW = "__bulkinfer_row"
"""Name of the column ``read_shard`` adds: each row's number in its file (errors and resume use it)."""

BadRow = Callable[[int, str], None]


def _numbered(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    return batch.append_column(ROW, pa.array(rows, type=pa.int64()))


def _read_parquet(
    shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    pf = pq.ParquetFile(_open_local_or_fs(shard.uri))
    _check_columns(shard.uri, pf.schema_arrow, columns)
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


def _jsonl_slow(
    shard: Shard, data: bytes, columns: Sequence[str], bad: BadRow, types: Mapping[str, pa.DataType]
) -> tuple[pa.Table, np.ndarray]:
    """Line by line: invalid JSON, non-object lines and values of the wrong type (for the
    column's type in this job; else the kind most of the shard's values have) become bad rows."""
    base = shard.base if shard.base is not None else shard.start
    good: list[dict[str, Any]] = []
    rows: list[int] = []
    n = base
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        row, n = n, n + 1
        if not shard.start <= row < shard.stop:
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            bad(row, f"invalid JSON ({exc})")
            continue
        if not isinstance(obj, dict):
            bad(row, f"expected a JSON object, got {type(obj).__name__}")
            continue
        missing = [c for c in columns if c not in obj]
        if missing:
            bad(row, f"missing field {missing[0]!r}")
            continue
        good.append(obj)
        rows.append(row)
    arrays = []
    keep = np.ones(len(good), dtype=bool)
    for col in columns:
        values = [g[col] for g in good]
        if col in types:
            for i, v in enumerate(values):
                try:
                    good[i][col] = fit_value(v, types[col])
                except ValueError:
                    if keep[i]:
                        keep[i] = False
                        bad(rows[i], f"field {col!r} is {type(v).__name__}, expected {types[col]}")
            continue
        kinds = Counter(type(v).__name__ for v in values if v is not None)
        if len(kinds) > 1 and not set(kinds) <= {"int", "float"}:
            major = kinds.most_common(1)[0][0]
            for i, v in enumerate(values):
                if v is not None and type(v).__name__ != major and keep[i]:
                    keep[i] = False
                    bad(rows[i], f"field {col!r} is {type(v).__name__}, expected {major}")
    good = [g for g, k in zip(good, keep, strict=True) if k]
    kept_rows = np.array(rows, dtype=np.int64)[keep]
    for col in columns:
        arrays.append(pa.array([g[col] for g in good], type=types.get(col)))
    return pa.Table.from_arrays(arrays, names=list(columns)), kept_rows


def _read_jsonl(
    shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    fs, path = _fs(shard.uri)
    assert shard.offset is not None and shard.end is not None
    with fs.open(path, "rb") as fh:
        fh.seek(shard.offset)
        data = fh.read(shard.end - shard.offset)
    try:
        schema = pa.schema([(c, types[c]) for c in columns if c in types])
        parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
        table = pajson.read_json(io.BytesIO(data), parse_options=parse)
        _check_columns(shard.uri, table.schema, columns)
    except pa.ArrowInvalid:
        table, rows = _jsonl_slow(shard, data, columns, bad, types)
        for b in table.to_batches(max_chunksize=batch_rows):
            yield _numbered(b, rows[: b.num_rows])
            rows = rows[b.num_rows :]
        return
    skip = shard.start - (shard.base if shard.base is not None else shard.start)
    table = table.select(list(columns)).slice(skip, shard.num_rows)
    yield from table.to_batches(max_chunksize=batch_rows)


def _read_csv(
    shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    """The shard's byte range parsed by pyarrow with the header's column names, the job's
    column types asked of pyarrow directly; if a value does not fit them, the range is
    parsed again with those columns as text, and :func:`read_shard` fails only the rows
    whose values do not convert."""
    names = _csv_header(shard.uri)
    fs, path = _fs(shard.uri)
    assert shard.offset is not None and shard.end is not None
    with fs.open(path, "rb") as fh:
        fh.seek(shard.offset)
        data = fh.read(shard.end - shard.offset)
    _check_columns(shard.uri, pa.schema([(n, pa.string()) for n in names]), columns)
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
        yield from _slices(batch, batch_rows)


def _parse_csv_range(
    shard: Shard, data: bytes, names: list[str], columns: Sequence[str], convert: pacsv.ConvertOptions, bad: BadRow
) -> list[pa.RecordBatch]:
    """Every batch of the shard, numbered; ragged records go to ``bad`` with their numbers
    and the others are numbered around them (pyarrow reports a block's ragged rows before
    yielding it). Whole before anything is yielded, so a conversion error can start over."""
    base = shard.base if shard.base is not None else shard.start
    ragged = _RaggedRows(base)
    opts = pacsv.ReadOptions(column_names=names, block_size=1 << 22, use_threads=False)
    parse = pacsv.ParseOptions(invalid_row_handler=ragged)
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
            out.append(_numbered(batch.select(list(columns)).slice(first, keep - first), rows[first:keep]))
        if keep < batch.num_rows:
            break
    for row in ragged.rows:  # once the parse has succeeded
        if shard.start <= row < shard.stop:
            bad(row, ragged.messages[row])
    return out


def _slices(batch: pa.RecordBatch, size: int) -> Iterator[pa.RecordBatch]:
    for off in range(0, batch.num_rows, size):
        yield batch.slice(off, size)


_READERS = {"parquet": _read_parquet, "jsonl": _read_jsonl, "csv": _read_csv}


def read_shard(
    shard: Shard,
    columns: Sequence[str],
    batch_rows: int = 4096,
    on_bad_row: BadRow | None = None,
    types: Mapping[str, pa.DataType] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the shard's rows, in order, as record batches of ``columns`` plus :data:`ROW`,
    each column of ``types`` converted to its type there.

    Rows that cannot be parsed (a JSONL line, a ragged CSV record) or whose value does not
    fit the column's type are skipped and reported to ``on_bad_row(row, message)``; without
    it they raise :class:`SourceError`.
    """
    types = types or {}

    def bad(row: int, message: str) -> None:
        if on_bad_row is None:
            raise SourceError(f"{shard.uri}: row {row}: {message}")
        on_bad_row(row, message)

    next_row = shard.start
    try:
        for batch in _READERS[shard.format](shard, columns, batch_rows, bad, types):
            if ROW not in batch.schema.names:
                batch = _numbered(batch, np.arange(next_row, next_row + batch.num_rows))
            if batch.num_rows:
                next_row = int(batch.column(ROW)[-1].as_py()) + 1
            if any(c in types and batch.schema.field(c).type != types[c] for c in columns):
                table, _rows = convert_rows(pa.Table.from_batches([batch]), types, batch.column(ROW).to_numpy(), bad)
                if not table.num_rows:
                    continue
                batch = table.combine_chunks().to_batches()[0]
            yield batch
    except FileNotFoundError as exc:
        raise SourceError(f"{shard.uri}: the file disappeared after planning; restore it and rerun") from exc
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{shard.uri}: cannot read rows {shard.start}-{shard.stop} ({exc})") from exc
