"""Reading a finished output (a folder or an object-store prefix) the way a downstream reader
does: its ``_SUCCESS`` manifest, its committed parts, the job that wrote it and what that
job kept in ``_bulkinfer/`` (plan, report, statistics). Used by ``index``, ``compare``,
``report`` and ``costs``; never by a run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import SourceError
from ..core.layout import PRIVATE, SUCCESS, result_columns
from ..core.storage import file_version, path_or_file, read_whole
from ..plan import plan_fields

__all__ = [
    "BATCH_ROWS",
    "Part",
    "file_version",
    "finished_output",
    "normalise",
    "part_batches",
    "part_schema",
    "private_json",
]

BATCH_ROWS = 8192


@dataclass(frozen=True)
class Part:
    """A committed part of a finished output."""

    path: str  # a local path or an object-store URI
    name: str
    rows: int
    first: int  # global position of its first row


def normalise(output: str | Path) -> str:
    """An output's location as the readers want it: a URI without a trailing slash, or a local path."""
    return str(output).rstrip("/") if "://" in str(output) else str(Path(output).expanduser())


def private_json(out: str, name: str) -> dict[str, Any] | None:
    """A JSON file the run kept in ``_bulkinfer/`` (report.json, stats.json; job.json without its
    shards, which only a resume reads: :meth:`~bulkinfer.plan.JobPlan.from_lines`), or None."""
    data = read_whole(f"{out}/{PRIVATE}/{name}")
    if data is None:
        return None
    return plan_fields(data) if name == "job.json" else dict(json.loads(data))


def finished_output(out: str, what: str = "indexed") -> tuple[list[Part], dict[str, Any]]:
    """The committed Parquet parts of a finished output (its ``_SUCCESS``) and its job.json."""
    manifest = read_whole(f"{out}/{SUCCESS}")
    if manifest is None:
        raise SourceError(f"{out}: no finished run here (no _SUCCESS); let the job complete first", out)
    job = private_json(out, "job.json") or {}
    parts, first = [], 0
    for f in json.loads(manifest)["files"]:
        if not f["name"].endswith(".parquet"):
            raise SourceError(f"{out}/{f['name']}: only Parquet output can be {what}", out)
        parts.append(Part(f"{out}/{f['name']}", f["name"], int(f["rows"]), first))
        first += int(f["rows"])
    return parts, job


def part_schema(parts: list[Part]) -> pa.Schema | None:
    """The Arrow schema of an output's parts (its first part's; None when it has none)."""
    return pq.ParquetFile(path_or_file(parts[0].path)).schema_arrow if parts else None


def part_batches(part: Part, columns: list[str], hint: str = "pass --column") -> Iterator[pa.RecordBatch]:
    """``columns`` of a part, in batches; a missing column is one line naming the part."""
    pf = pq.ParquetFile(path_or_file(part.path))
    missing = [c for c in columns if c not in pf.schema_arrow.names]
    if missing:
        has = ", ".join(result_columns(pf.schema_arrow.names))
        raise SourceError(
            f"{part.path}: no column {missing[0]!r} (it has {has}); {hint}",
            str(part.path),
        )
    yield from pf.iter_batches(batch_size=BATCH_ROWS, columns=columns)
