"""The rows of a review queue, and what reviewers' verdicts say of the rule that sent them.

A queue holds the rows a route sent to review (its folder export) and, with an audit, a sample
of the rows the job published (the output's own rows): the ``audit`` whose ids hash lowest
(:func:`~bulkinfer.outputs.compare.id_hashes`, as ``compare --sample`` draws), so every start
draws the same rows and a larger audit keeps the smaller one's. Audited rows are spread evenly
through the queue, so the first hour of review already measures both sides.

Verdicts on the sent rows give the rule's **precision** (the share of them reviewers
rejected); verdicts on the audited rows the **miss rate** (the share of published rows they
would have held back); together, weighted by how many rows each side has, the rule's
**recall**: ``sent x precision / (sent x precision + published x miss rate)``. Rows other routes
took (a ``block`` route) are on neither side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..core.errors import ConfigError
from ..finished.read import finished_output, part_batches, part_schema
from .compare import lowest_ids
from .review import DECISIONS, queue_folder, sent_by

__all__ = ["AUDIT_RULE", "QueueRows", "gate_figures", "queue_rows", "read_verdicts", "review_figures", "reviewed"]

AUDIT_RULE = "audit: a sample of the rows the job published (no route took it)"


@dataclass(frozen=True)
class QueueRows:
    """``table``: the sent rows, then the audited ones; ``ids``: the queue's order."""

    table: pa.Table
    ids: list[str]
    audited: frozenset[str]
    id_column: str
    sent: int  # the rows the route sent (the table's first)
    published: int  # the rows of the job's own output


def queue_rows(out: str, folder: Path, config: Mapping[str, Any], audit: int = 0) -> QueueRows:
    """The rows under review in ``folder`` (the route's parts) and ``audit`` of ``out``'s own."""
    import pyarrow.dataset as pads

    sent = pads.dataset(folder, format="parquet").to_table()
    id_column = (config.get("source") or {}).get("id_column") or "id"
    if id_column not in sent.column_names:
        raise ConfigError(f"{folder}: the review rows have no id column {id_column!r}; the job needs an id column")
    parts, _ = finished_output(out, "audited")
    published = sum(p.rows for p in parts)
    audited = _audit_sample(parts, id_column, audit) if audit > 0 else sent.slice(0, 0)
    try:
        table = pa.concat_tables([sent, audited], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ConfigError(f"--audit: {out}'s rows and {folder}'s differ ({exc}); review without --audit") from None
    ids = [str(v) for v in table.column(id_column).to_pylist()]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{folder}: an id appears twice among the review rows; a decision names one row")
    sent_ids, audit_ids = ids[: sent.num_rows], ids[sent.num_rows :]
    return QueueRows(table, _spread(sent_ids, audit_ids), frozenset(audit_ids), id_column, sent.num_rows, published)


def _spread(first: list[str], second: list[str]) -> list[str]:
    """Both lists in one, ``second``'s items spread evenly among ``first``'s."""
    keyed = [((i + 0.5) / len(first), 0, v) for i, v in enumerate(first)]
    keyed += [((i + 0.5) / len(second), 1, v) for i, v in enumerate(second)]
    return [v for *_, v in sorted(keyed)]


def _audit_sample(parts: list[Any], id_column: str, n: int) -> pa.Table:
    """The ``n`` rows of ``parts`` whose ids hash lowest: their ids in one pass, the rows in a second."""
    import pyarrow.compute as pc

    best_ids = lowest_ids(parts, id_column, n)
    schema = part_schema(parts)
    if best_ids is None or schema is None:
        return pa.table({id_column: pa.array([], pa.string())})
    chosen = [
        batch.filter(pc.is_in(batch.column(id_column), value_set=best_ids))
        for part in parts
        for batch in part_batches(part, schema.names)
    ]
    return pa.Table.from_batches(chosen, schema=schema)


def read_verdicts(folder: Path) -> dict[str, str]:
    """Each decided row's verdict, from the queue's decisions table (none yet: empty)."""
    import pyarrow.parquet as pq

    path = folder / DECISIONS
    if not path.exists():
        return {}
    table = pq.read_table(path, columns=["id", "verdict"])
    return dict(zip(table.column("id").to_pylist(), table.column("verdict").to_pylist(), strict=True))


def review_figures(
    rows: QueueRows, config: Mapping[str, Any], route: str, verdicts: Mapping[str, str]
) -> dict[str, Any]:
    """Each rule's rows, approvals, rejections and precision; the audit's; the whole rule's
    precision, miss rate and recall (None where no verdict measures it)."""
    rules: dict[str, dict[str, Any]] = {}
    for at in range(rows.sent):
        rule = sent_by(config, route, rows.table.slice(at, 1))
        _count(rules.setdefault(rule, _empty()), verdicts.get(str(rows.table.column(rows.id_column)[at].as_py())))
    audit, sent_ids = _empty(), set(rows.ids) - rows.audited
    audit["rows"] = len(rows.audited)
    for row_id, verdict in verdicts.items():
        if row_id not in sent_ids:  # an audited row (of this audit or of a larger one before)
            _count(audit, verdict, counted=False)
    audit["rows"] = max(audit["rows"], audit["approved"] + audit["rejected"])  # read without the sample: the decided
    sent = _empty()
    for figures in rules.values():
        for key in ("rows", "approved", "rejected"):
            sent[key] += figures[key]
    for figures in (*rules.values(), sent, audit):
        _finish(figures)
    return {
        "rows": len(rows.ids), "decided": len(verdicts), "rules": rules, "sent": sent, "audit": audit,
        "published": rows.published, "precision": sent["precision"], "miss_rate": audit["precision"],
        "recall": _recall(sent, rows.published, audit),
    }  # fmt: skip


def _empty() -> dict[str, Any]:
    return {"rows": 0, "approved": 0, "rejected": 0}


def _count(figures: dict[str, Any], verdict: str | None, counted: bool = True) -> None:
    figures["rows"] += counted
    if verdict is not None:
        figures["approved" if verdict == "approve" else "rejected"] += 1


def _finish(figures: dict[str, Any]) -> None:
    """Pending rows and the share of reviewed rows rejected (precision; on the audit, the miss rate)."""
    reviewed = figures["approved"] + figures["rejected"]
    figures["pending"] = max(figures["rows"] - reviewed, 0)
    figures["precision"] = round(figures["rejected"] / reviewed, 4) if reviewed else None


def _recall(sent: Mapping[str, Any], published: int, audit: Mapping[str, Any]) -> float | None:
    """The share of the rows reviewers would hold back that the rule sent: each side's rejected
    share of its reviewed rows, times its rows."""
    if sent["precision"] is None or audit["precision"] is None:
        return None
    caught = sent["rows"] * sent["rejected"] / (sent["approved"] + sent["rejected"])
    missed = published * audit["rejected"] / (audit["approved"] + audit["rejected"])
    return round(caught / (caught + missed), 4) if caught + missed else None


def reviewed(out: str, route: str) -> dict[str, Any]:
    """:func:`review_figures` of ``out``'s review queue as its decisions table has it now (read
    only: ``bulkinfer compare OUT --reviews ROUTE``)."""
    folder, config = queue_folder(out, route)
    return review_figures(queue_rows(out, folder, config), config, route, read_verdicts(folder))


def gate_figures(result: Mapping[str, Any]) -> dict[str, float | None]:
    """The figures a ``--fail-if`` over reviews reads: ``precision``, ``recall``, ``miss_rate``,
    ``reviewed`` (sent rows decided), ``audited`` (published rows decided), ``pending``."""
    return {
        "precision": result["precision"], "recall": result["recall"], "miss_rate": result["miss_rate"],
        "reviewed": result["sent"]["approved"] + result["sent"]["rejected"],
        "audited": result["audit"]["approved"] + result["audit"]["rejected"],
        "pending": result["sent"]["pending"] + result["audit"]["pending"],
    }  # fmt: skip
