"""``bulkinfer costs OUT1/ OUT2/ ...``: the monthly bill by team and model.

Every run, complete or stopped, leaves ``_bulkinfer/runs/<start>-<id>.json`` with its wall
time, its price per hour, its cost and ``cost.labels``; this module gathers those entries
from any number of outputs (folders, object-store prefixes, globs of either) and sums them
by month (UTC, of the run's start) and label.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..core.errors import SourceError
from ..core.storage import filesystem
from ..finished.read import normalise

__all__ = ["collect_runs", "render", "sum_costs"]


def _expand(pattern: str) -> list[str]:
    """The outputs a pattern names (a glob matching folders, or one folder)."""
    where = normalise(pattern)
    fs, path = filesystem(where)
    if not any(c in path for c in "*?["):
        return [where]
    proto = where.split("://", 1)[0] + "://" if "://" in where else ""
    found = sorted(p for p in fs.glob(path) if fs.isdir(p))
    if not found:
        raise SourceError(f"{pattern}: the pattern matches no output folder", pattern)
    return [proto + p if proto and not p.startswith(proto) else p for p in found]


def collect_runs(patterns: Iterable[str]) -> list[dict[str, Any]]:
    """Every run entry of the outputs (each with the output it belongs to)."""
    runs: list[dict[str, Any]] = []
    for pattern in patterns:
        for out in _expand(pattern):
            fs, path = filesystem(out)
            names = sorted(fs.glob(f"{path}/_bulkinfer/runs/*.json"))
            if not names and not fs.exists(f"{path}/_bulkinfer/job.json"):
                raise SourceError(f"{out}: not a bulkinfer output (no _bulkinfer/job.json)", out)
            for name in names:
                try:
                    entry = json.loads(fs.cat_file(name))
                except (OSError, ValueError) as exc:
                    raise SourceError(f"{out}/{name.rsplit('/', 1)[-1]}: unreadable run entry ({exc})", out) from exc
                runs.append({**entry, "output": out})
    return runs


def sum_costs(runs: Sequence[dict[str, Any]], by: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of (month, each label in ``by``) with runs, hours, rows and cost; ``by`` defaults to
    every label key any run has. A run without a label is booked under "-" for it."""
    keys = list(by) if by is not None else sorted({k for r in runs for k in r.get("labels", {})})
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in runs:
        labels = r.get("labels", {})
        key = (r["started_at"][:7], *(str(labels.get(k, "-")) for k in keys), r.get("currency", "USD"))
        g = groups.setdefault(key, {"runs": 0, "hours": 0.0, "rows": 0, "cost": 0.0, "outputs": set()})
        g["runs"] += 1
        g["hours"] += float(r["wall_s"]) / 3600
        g["rows"] += int(r["rows_out"])
        g["cost"] += float(r["cost"])
        g["outputs"].add(r["output"])
    out = []
    for key in sorted(groups):
        g = groups[key]
        row: dict[str, Any] = {"month": key[0], **dict(zip(keys, key[1:-1], strict=True))}
        row.update(
            {
                "runs": g["runs"],
                "outputs": len(g["outputs"]),
                "hours": round(g["hours"], 4),
                "rows": g["rows"],
                "cost": round(g["cost"], 6),
                "currency": key[-1],
            }
        )
        row["cost_per_million_rows"] = round(g["cost"] / g["rows"] * 1e6, 4) if g["rows"] else None
        out.append(row)
    return out


def render(rows: Sequence[dict[str, Any]], fmt: str) -> str:
    """The bill as a table (fixed-width text), CSV or JSON."""
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if not rows:
        return "no runs" if fmt == "table" else ""
    head = list(rows[0])
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=head, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()
    cells = [head] + [["-" if r[h] is None else str(r[h]) for h in head] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i < len(head) - 5 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    ]
    total = sum(r["cost"] for r in rows)
    currencies = sorted({r["currency"] for r in rows})
    lines.append(f"total {round(total, 6)} {'/'.join(currencies)}")
    return "\n".join(lines)
