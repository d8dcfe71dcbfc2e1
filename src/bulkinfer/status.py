"""What an output holds (a folder or an object-store prefix): committed, remaining, errors,
fingerprint (``bulkinfer inspect``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .committer import remaining_work
from .errors import OutputError
from .ledger import ERRORS, SUCCESS, Ledger

if TYPE_CHECKING:
    from .objledger import ObjectLedger

__all__ = ["inspect_output"]


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
    from .sinks import is_remote

    if is_remote(str(out_dir)):
        from .objledger import ObjectLedger
        from .sinks.objects import ObjectStore

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
    commits = ledger.commits(repair=False)
    todo = remaining_work(shards, commits)  # partial commits leave a shard's tail to do
    rows_planned = sum(s.num_rows for s in shards)
    rows_committed = sum(c.rows + c.routed for c in commits)
    report = ledger.read_private("report.json")
    holder = ledger.live_holder()
    return {
        "output": where,
        "job_fingerprint": plan.fingerprint,
        "model": {"kind": plan.model_kind, "location": plan.model_location},
        "inputs": len(plan.inputs),
        "column_types": plan.column_types or {},
        "shards_planned": len(shards),
        "shards_committed": len(shards) - len({s.index for s in todo}),
        "shards_remaining": len({s.index for s in todo}),
        "rows_planned": rows_planned,
        "rows_committed": rows_committed,
        "rows_remaining": sum(s.num_rows for s in todo),
        "error_records": error_records,
        "complete": complete,
        "running": holder is not None,
        "lock_holder": holder,
        "last_run": None
        if report is None
        else {k: report.get(k) for k in ("status", "rows_out", "rows_per_s", "wall_s")},
    }
