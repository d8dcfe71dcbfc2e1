"""The file sink: a shard's table serialised (Parquet, JSONL or CSV), written under a hidden
temporary name, made durable, and renamed into place in a local or shared folder.

A part is invisible (``.``-prefixed) until the atomic rename; after the rename it is
complete. Readers that skip names starting with ``_`` or ``.`` never see half a file.
Only the ledger decides that a part is committed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..core.errors import OutputError
from ..core.faults import crash_point, io_point
from ..core.layout import ERRORS
from ..core.records import encode_records
from ..core.tensors import nested_lists
from ..sources.shard import ShardOutput
from .lifecycle import Part, Published, Staged, StagedOutput

__all__ = [
    "ERRORS",
    "EXTENSIONS",
    "FileSink",
    "deserialize",
    "fsync_dir",
    "part_name",
    "publish",
    "serialize",
    "stage_bytes",
    "write_bytes",
    "write_part",
]

EXTENSIONS = {"parquet": ".parquet", "jsonl": ".jsonl", "csv": ".csv", "openai-batch": ".jsonl", "delta": ".parquet",
              "zarr": ".parquet"}  # fmt: skip


def part_name(shard_index: int, fmt: str, start: int | None = None) -> str:
    """``part-00003.parquet`` for a whole shard; ``part-00003_0000012345.parquet`` for a tail
    starting at row 12345 (after a partial commit)."""
    tail = "" if start is None else f"_{start:010d}"  # "_" sorts after ".": tails list after their head
    return f"part-{shard_index:05d}{tail}{EXTENSIONS[fmt]}"


def _jsonable(table: pa.Table) -> pa.Table:
    """CSV cannot hold lists: nested columns become JSON text."""
    cols = []
    for col in _nested(table).columns:
        if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_struct(col.type):
            col = pa.array([None if v is None else json.dumps(v) for v in col.to_pylist()], pa.string())
        cols.append(col)
    return pa.table(cols, names=table.column_names)


def _nested(table: pa.Table) -> pa.Table:
    """Tensor columns as nested lists (:func:`~bulkinfer.core.tensors.nested_lists`), for text formats."""
    if not any(isinstance(f.type, pa.FixedShapeTensorType) for f in table.schema):
        return table
    return pa.table([nested_lists(c.combine_chunks()) for c in table.columns], names=table.column_names)


def serialize(table: pa.Table, fmt: str, compression: str = "zstd") -> bytes:
    """The bytes of ``table`` in the output format."""
    buf = io.BytesIO()
    if fmt == "zarr":  # the per-tile rows: the arrays are in array.zarr (sinks.zarr)
        arrays = [f.name for f in table.schema if isinstance(f.type, pa.FixedShapeTensorType)]
        pq.write_table(table.drop_columns(arrays), buf, compression=compression)
    elif fmt in ("parquet", "delta"):  # a Delta table's data files are Parquet
        pq.write_table(table, buf, compression=compression)
    elif fmt == "csv":
        pacsv.write_csv(_jsonable(table), buf)
    elif fmt == "openai-batch":
        from ..llm.batch_files import output_lines

        buf.write(output_lines(table))
    elif fmt == "jsonl":
        for row in _nested(table).to_pylist():
            buf.write(json.dumps(row, ensure_ascii=False, default=str).encode())
            buf.write(b"\n")
    else:  # pragma: no cover - config validation forbids it
        raise OutputError(f"sink.format: unknown format {fmt!r}")
    return buf.getvalue()


def deserialize(data: bytes, fmt: str) -> pa.Table:
    """The table in a part's bytes (JSONL and CSV with inferred types: CSV vectors come back as text)."""
    if fmt in ("parquet", "delta", "zarr"):
        return pq.read_table(io.BytesIO(data))
    if fmt == "csv":
        return pacsv.read_csv(io.BytesIO(data))
    if fmt == "openai-batch":
        from ..llm.batch_files import read_output_lines

        return read_output_lines(data)
    import pyarrow.json as pajson

    return pajson.read_json(io.BytesIO(data))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_part(out_dir: Path, name: str, table: pa.Table, fmt: str, compression: str = "zstd") -> Part:
    """Write ``table`` to ``out_dir/name`` atomically: temp file, fsync, rename, fsync directory."""
    return write_bytes(out_dir, name, serialize(table, fmt, compression), table.num_rows)


def stage_bytes(
    out_dir: Path, name: str, data: bytes | Iterable[bytes], rows: int, tag: str = "", what: str = "the part"
) -> Staged:
    """Write ``data`` (bytes, or chunks of them: a file never held whole) to a hidden temp file
    beside ``out_dir/name`` and fsync it.

    ``tag`` tells apart attempts that write the same name (a Ray worker's attempt id);
    by default the process id.
    """
    tmp = out_dir / f".{name}.tmp-{tag or os.getpid()}"
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as fh:
            io_point("part-write")
            for chunk in [data] if isinstance(data, bytes) else data:
                fh.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(out_dir / name, what, exc) from exc
    return Staged(tmp.name, Part(name=name, rows=rows, bytes=size, sha256=digest.hexdigest()))


def publish(
    out_dir: Path, staged: Staged, crash_at: str | None = "part-temp-written", what: str = "the part", sync: bool = True
) -> Part:
    """Rename a staged file into place and fsync the directory (``sync``; else the caller does,
    once for several renames, before anything relies on them).

    ``crash_at`` names the fault-injection point just before the rename.
    """
    tmp, final = out_dir / staged.temp, out_dir / staged.part.name
    try:
        if crash_at:
            crash_point(crash_at)
        os.replace(tmp, final)
        if sync:
            fsync_dir(out_dir)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(final, what, exc) from exc
    return staged.part


def write_bytes(
    out_dir: Path,
    name: str,
    data: bytes | Iterable[bytes],
    rows: int,
    crash_at: str | None = "part-temp-written",
    what: str = "the part",
) -> Part:
    """Write ``data`` to ``out_dir/name`` atomically (hidden temp file, fsync, rename, fsync directory)."""
    return publish(out_dir, stage_bytes(out_dir, name, data, rows, what=what), crash_at, what)


def _write_error(path: Path, what: str, exc: OSError) -> OutputError:
    return OutputError(
        f"{path}: cannot write {what} ({exc.strerror or exc}); free space or fix permissions, then rerun to resume"
    )


class FileSink:
    """Parts in ``out_dir``, error records in ``out_dir/_errors`` (see :mod:`.base` for the lifecycle)."""

    def __init__(self, out_dir: Path, fmt: str = "parquet", compression: str = "zstd", redact: bool = False) -> None:
        self.out_dir = out_dir
        self.errors_dir = out_dir / ERRORS
        self.format = fmt
        self.compression = compression
        self.redact = redact  # error files withhold the rows' values (execution.redact)

    def start(self) -> None:
        try:
            io_point("output-mkdir")
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{self.out_dir}: cannot create the output directory ({exc.strerror or exc})") from exc

    def stage(self, out: ShardOutput, start: int | None, tag: str = "", name: str | None = None) -> StagedOutput:
        """``name`` (without extension) overrides the part's usual name (``--retry-errors`` parts)."""
        shard = out.shard
        errors = part = None
        if out.errors:
            self.errors_dir.mkdir(exist_ok=True)
            errors_name = f"{name}.jsonl" if name else part_name(shard.index, "jsonl", start)
            errors = stage_bytes(
                self.errors_dir, errors_name, encode_records(out.errors, self.redact), len(out.errors), tag
            )
        if out.table.num_rows:
            data = serialize(out.table, self.format, self.compression)
            final = name + EXTENSIONS[self.format] if name else part_name(shard.index, self.format, start)
            part = stage_bytes(self.out_dir, final, data, out.table.num_rows, tag)
        first = out.errors[0].withheld(self.redact).headline() if out.errors else None
        unit = name or part_name(shard.index, self.format, start).removesuffix(EXTENSIONS[self.format])
        return StagedOutput(shard, part, errors, out.failed, first, unit)

    def publish(self, staged: StagedOutput) -> Published:
        return self._publish_files([staged])[0]

    def publish_many(self, staged: Sequence[StagedOutput]) -> list[Published]:
        return self._publish_files(staged)

    def _publish_files(self, staged: Sequence[StagedOutput]) -> list[Published]:
        """Every shard's files renamed into place, then one fsync of each folder renamed into."""
        done: list[tuple[StagedOutput, Published]] = []
        try:
            for s in staged:
                error_file = publish(self.errors_dir, s.errors, sync=False).name if s.errors else None
                done.append((s, Published(None, error_file)))
                if s.part:
                    done[-1] = (s, Published(publish(self.out_dir, s.part, sync=False), error_file))
                    crash_point("part-renamed")
            if any(s.errors for s in staged):
                fsync_dir(self.errors_dir)
            fsync_dir(self.out_dir)
        except BaseException:
            for s, p in done:  # renamed, but no ledger line will vouch for them
                self.withdraw(s, p)
            raise
        return [p for _, p in done]

    def reveal(self, staged: StagedOutput) -> None:
        """Nothing: the rename in :meth:`publish` already put the part in place."""

    def withdraw(self, staged: StagedOutput, published: Published) -> None:
        """Remove the renamed part and error file (no ledger line vouches for them)."""
        if published.part is not None:
            (self.out_dir / published.part.name).unlink(missing_ok=True)
        if published.error_file is not None:
            (self.errors_dir / published.error_file).unlink(missing_ok=True)
        fsync_dir(self.out_dir)

    def discard(self, staged: StagedOutput) -> None:
        if staged.part:
            (self.out_dir / staged.part.temp).unlink(missing_ok=True)
        if staged.errors:
            (self.errors_dir / staged.errors.temp).unlink(missing_ok=True)

    def complete(self) -> None:
        self._sweep()

    def failed(self) -> None:
        self._sweep()

    def _sweep(self) -> None:
        """Remove temporary files of attempts that were never published (a Ray attempt that
        lost a race or was cut off). Nothing visible or committed is touched."""
        for folder in (self.out_dir, self.errors_dir):
            if folder.is_dir():
                for p in folder.glob(".part-*.tmp-*"):
                    p.unlink(missing_ok=True)
