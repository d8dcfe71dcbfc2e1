"""What an output holds (a folder or an object-store prefix): committed, remaining, errors,
fingerprint (``bulkinfer inspect``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..commit.committer import remaining_work
from ..commit.ledger import CommitTally, Ledger
from ..core.errors import OutputError
from ..core.layout import ERRORS, SUCCESS

if TYPE_CHECKING:
    from ..commit.objledger import ObjectLedger

__all__ = ["inspect_output", "inspect_part", "is_part_file"]


def is_part_file(where: str) -> bool:
    """Whether ``where`` names one result file rather than an output."""
    return where.rstrip("/").rsplit("/", 1)[-1].endswith((".parquet", ".jsonl", ".csv"))


def inspect_part(where: str) -> dict[str, Any]:
    """A part's rows, columns and provenance (Parquet key-value metadata), and whether the
    ``_SUCCESS`` beside it (when there is one) lists it with the same checksum."""
    import hashlib
    import json

    import pyarrow.parquet as pq

    from ..commit.committer import PROVENANCE_KEY
    from ..core.storage import read_whole

    if not where.endswith(".parquet"):
        raise OutputError(f"{where}: only Parquet parts carry their provenance; inspect the output folder instead")
    data = read_whole(where)
    if data is None:
        raise OutputError(f"{where}: no such file")
    import io

    try:
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise OutputError(f"{where}: not a readable Parquet file ({' '.join(str(exc).split())[:160]})") from exc
    kv = meta.metadata or {}
    provenance = json.loads(kv[PROVENANCE_KEY]) if PROVENANCE_KEY in kv else None
    folder, _, name = where.rstrip("/").rpartition("/")
    manifest = read_whole(f"{folder}/{SUCCESS}") if folder else None
    listed = None
    if manifest is not None:
        files = {f["name"]: f for f in json.loads(manifest).get("files", [])}
        entry = files.get(name)
        listed = None if entry is None else entry["sha256"] == hashlib.sha256(data).hexdigest()
    return {
        "file": where,
        "rows": meta.num_rows,
        "columns": meta.schema.to_arrow_schema().names,
        "bytes": len(data),
        "provenance": provenance,
        "in_manifest": listed,  # None: no _SUCCESS beside it, or it does not list this file
    }


def _count_error_records(path: Path) -> int:
    if not path.is_dir():
        return 0
    total = 0
    for f in path.iterdir():
        if f.is_file() and not f.name.startswith("."):
            with f.open("rb") as fh:
                total += sum(1 for line in fh if line.strip())
    return total


def inspect_output(out_dir: str | Path, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Describe the job in ``out_dir`` (a folder or an object-store prefix) without changing anything."""
    from ..sinks import is_remote

    if is_remote(str(out_dir)):
        from ..commit.objledger import ObjectLedger
        from ..sinks.objects import ObjectStore

        store = ObjectStore(str(out_dir), storage_options or {})
        remote = ObjectLedger(store)
        errors = store.get_many([k for k in store.ls(ERRORS) if not k.rsplit("/", 1)[1].startswith(".")])
        error_records = sum(1 for data in errors.values() for line in data.splitlines() if line.strip())
        return _describe(store.uri, remote, store.exists(SUCCESS), error_records)
    out = Path(out_dir)
    return _describe(str(out), Ledger(out), (out / SUCCESS).is_file(), _count_error_records(out / ERRORS))


def _describe(where: str, ledger: Ledger | ObjectLedger, complete: bool, error_records: int) -> dict[str, Any]:
    plan = ledger.read_plan()
    if plan is None:
        raise OutputError(f"{where}: not a bulkinfer output directory (no _bulkinfer/job.json)")
    shards = plan.shards
    tally = CommitTally.of(ledger.iter_commits(repair=False), names=False)  # folded as read
    todo = remaining_work(shards, tally)  # partial commits leave a shard's tail to do
    rows_planned = plan.rows
    rows_committed = tally.rows + tally.routed
    remaining = len(np.unique(todo.indexes()))
    report = ledger.read_private("report.json")
    holder = ledger.live_holder()
    return {
        "output": where,
        "job_fingerprint": plan.fingerprint,
        "model": {"kind": plan.model_kind, "location": plan.model_location},
        "inputs": len(plan.inputs),
        "column_types": plan.column_types or {},
        "shards_planned": len(shards),
        "shards_committed": len(shards) - remaining,
        "shards_remaining": remaining,
        "rows_planned": rows_planned,
        "rows_committed": rows_committed,
        "rows_remaining": todo.rows(),
        "error_records": error_records,
        "complete": complete,
        "running": holder is not None,
        "lock_holder": holder,
        "last_run": None
        if report is None
        else {k: report.get(k) for k in ("status", "rows_out", "rows_per_s", "wall_s")},
    }
