"""What an output directory holds: committed, remaining, errors, fingerprint (``bulkinfer inspect``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .committer import remaining_work
from .errors import OutputError
from .ledger import ERRORS, SUCCESS, Ledger

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


def inspect_output(out_dir: str | Path) -> dict[str, Any]:
    """Describe the job in ``out_dir`` without changing anything."""
    out = Path(out_dir)
    ledger = Ledger(out)
    plan = ledger.read_plan()
    if plan is None:
        raise OutputError(f"{out}: not a bulkinfer output directory (no _bulkinfer/job.json)")
    shards = plan.shards
    commits = ledger.commits(repair=False)
    todo = remaining_work(shards, commits)  # partial commits leave a shard's tail to do
    rows_planned = sum(s.num_rows for s in shards)
    rows_committed = sum(c.rows + c.routed for c in commits)
    report_path = ledger.private / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    holder = ledger.live_holder()
    return {
        "output": str(out),
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
        "error_records": _count_error_records(out / ERRORS),
        "complete": (out / SUCCESS).is_file(),
        "running": holder is not None,
        "lock_holder": holder,
        "last_run": None
        if report is None
        else {k: report.get(k) for k in ("status", "rows_out", "rows_per_s", "wall_s")},
    }
