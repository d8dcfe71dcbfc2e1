"""Rebuild ``commits.log`` from the files themselves (``bulkinfer run --repair``).

Every visible part covers a contiguous row range ``[start, stop)`` of one planned shard in
which each row is either written to the part or recorded in the part's error file, so
``stop = start + rows written + rows failed``. The shard and ``start`` come from the
name (``part-00003.parquet`` starts where shard 3 starts, ``part-00003_0000012345.parquet``
at row 12345); ``.retry-N`` parts hold rows a ``--retry-errors`` run fixed, and the error
file with the highest N is the one in force. Visible parts are always complete (they appear by atomic rename), so a
part that was renamed but never logged is adopted rather than redone.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..core.errors import LedgerError
from .ledger import Commit, Ledger

__all__ = ["rebuild_ledger"]

_NAME = re.compile(r"^part-(\d{5})(?:_(\d{10}))?(?:\.retry-(\d+))?\.(parquet|jsonl|csv)$")


def _rows_in(path: Path) -> int:
    if path.suffix == ".parquet":
        return int(pq.ParquetFile(path).metadata.num_rows)
    if path.suffix == ".csv":
        return int(pacsv.read_csv(path).num_rows)
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def _failed_in(path: Path) -> int:
    with path.open(encoding="utf-8") as fh:
        return sum(int(json.loads(line).get("rows", 1)) for line in fh if line.strip())


def rebuild_ledger(ledger: Ledger) -> list[Commit]:
    """Write a new ``commits.log`` describing the parts and error files present; return it."""
    job = ledger.read_plan()
    if job is None:
        raise LedgerError(f"{ledger.out_dir}: no _bulkinfer/job.json; nothing to repair, rerun with --overwrite")
    plan = {s.index: s for s in job.shards}
    parts: dict[tuple[int, int], list[tuple[int, Path]]] = {}
    errors: dict[tuple[int, int], list[tuple[int, Path]]] = {}
    candidates = [p for p in ledger.out_dir.iterdir() if p.is_file()]
    if ledger.errors_dir.is_dir():
        candidates += [p for p in ledger.errors_dir.iterdir() if p.is_file()]
    for p in candidates:
        m = _NAME.match(p.name)
        if not m or int(m.group(1)) not in plan:
            continue
        index = int(m.group(1))
        key = (index, int(m.group(2)) if m.group(2) else plan[index].start)
        bucket = errors if p.parent == ledger.errors_dir else parts
        bucket.setdefault(key, []).append((int(m.group(3) or 0), p))
    commits: list[Commit] = []
    ends: dict[int, int] = {}
    for key in sorted(set(parts) | set(errors)):
        index, start = key
        files = [p for _n, p in sorted(parts.get(key, []))]
        latest = max(errors[key])[1] if key in errors else None
        counts = [_rows_in(p) for p in files]
        failed = _failed_in(latest) if latest else 0
        stop = start + sum(counts) + failed
        if stop > plan[index].stop:
            raise LedgerError(
                f"{files[0] if files else latest}: with its siblings covers rows up to {stop}, past the end "
                f"of shard {index} ({plan[index].stop}); remove it or rerun with --overwrite"
            )
        entries: list[tuple[Path | None, int]] = list(zip(files, counts, strict=True)) or [(None, 0)]
        if start < ends.get(index, start):
            raise LedgerError(f"shard {index}: parts overlap at row {start}; rerun with --overwrite")
        ends[index] = stop
        for i, (f, rows) in enumerate(entries):
            data = f.read_bytes() if f else b""
            first = i == 0
            commits.append(
                Commit(
                    index,
                    start,
                    stop,
                    f.name if f else "",
                    rows,
                    len(data),
                    hashlib.sha256(data).hexdigest() if f else "",
                    failed if first else 0,
                    latest.name if first and latest else None,
                )
            )
    ledger.replace_log(commits)
    return commits
