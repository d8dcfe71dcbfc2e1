"""Turn a finished shard into committed files: error records, then the part, then the
ledger line, and keep the error budget.

Order matters: ``_errors/part-….jsonl`` and ``part-….parquet`` are each written to a
hidden temp file and renamed; only the ledger line, appended last, makes them count.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import ErrorBudgetExceeded
from .faults import crash_point
from .ledger import ERRORS, Commit, Ledger
from .sinks import EXTENSIONS, Staged, part_name, publish, serialize, stage_bytes, write_bytes, write_part

if TYPE_CHECKING:
    from pathlib import Path

    from .config import JobConfig
    from .report import RunStats
    from .runners import ShardOutput
    from .sources import Shard

__all__ = [
    "Committer",
    "RetryCommitter",
    "RetryUnit",
    "StagedOutput",
    "discard",
    "remaining_work",
    "retry_units",
    "stage_output",
]


def _failed(errors: list[dict[str, Any]]) -> int:
    """Rows the records stand for (a shard-level record covers several)."""
    return sum(int(e.get("rows", 1)) for e in errors)


def _error_bytes(errors: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(e, default=str) + "\n" for e in errors).encode()


def _write_errors(ledger: Ledger, name: str, errors: list[dict[str, Any]]) -> None:
    ledger.errors_dir.mkdir(exist_ok=True)
    write_bytes(ledger.errors_dir, name, _error_bytes(errors), len(errors))


def remaining_work(planned: list[Shard], commits: list[Commit]) -> list[Shard]:
    """The row ranges of ``planned`` that no commit covers, as shards (tails keep their index)."""
    covered: dict[int, list[tuple[int, int]]] = {}
    for c in commits:
        covered.setdefault(c.shard, []).append((c.start, c.stop))
    todo = []
    for shard in planned:
        pos = shard.start
        for start, stop in sorted(covered.get(shard.index, [])):
            if start > pos:
                todo.append(replace(shard, start=pos, stop=start))
            pos = max(pos, stop)
        if pos < shard.stop:
            todo.append(replace(shard, start=pos))
    return todo


@dataclass(frozen=True)
class StagedOutput:
    """A finished shard's part and error file, durable under temporary names and not yet
    committed: what a Ray worker hands back to the driver, which alone commits."""

    shard: Shard
    part: Staged | None
    errors: Staged | None
    failed: int
    first_error: str | None


def stage_output(out_dir: Path, cfg: JobConfig, out: ShardOutput, planned_start: int, tag: str = "") -> StagedOutput:
    """Write ``out``'s error records and part under temporary names (``tag`` marks the attempt)."""
    shard, fmt = out.shard, cfg.sink.format
    start = None if shard.start == planned_start else shard.start
    errors = part = None
    first = None
    if out.errors:
        e = out.errors[0]
        first = f"{e['input']} row {e['row']}: {e['error_type']}: {e['message']}"[:300]
        (out_dir / ERRORS).mkdir(exist_ok=True)
        name = part_name(shard.index, "jsonl", start)
        errors = stage_bytes(out_dir / ERRORS, name, _error_bytes(out.errors), len(out.errors), tag)
    if out.table.num_rows:
        data = serialize(out.table, fmt, cfg.sink.compression)
        part = stage_bytes(out_dir, part_name(shard.index, fmt, start), data, out.table.num_rows, tag)
    return StagedOutput(shard, part, errors, _failed(out.errors), first)


def discard(out_dir: Path, staged: StagedOutput) -> None:
    """Delete the temporary files of an attempt that will not be committed."""
    if staged.part:
        (out_dir / staged.part.temp).unlink(missing_ok=True)
    if staged.errors:
        (out_dir / ERRORS / staged.errors.temp).unlink(missing_ok=True)


@dataclass
class Committer:
    """Commits shard outputs for one run; raises once the error budget is spent."""

    cfg: JobConfig
    ledger: Ledger
    stats: RunStats
    planned_starts: dict[int, int]
    failed_before: int
    on_commit: Callable[[], None] = lambda: None
    first_error: str | None = None

    @property
    def budget(self) -> int:
        ex = self.cfg.execution
        by_rate = int(ex.max_error_rate * self.stats.rows_planned)
        return by_rate if ex.max_errors is None else min(by_rate, ex.max_errors)

    def __call__(self, out: ShardOutput) -> None:
        out_dir = self.ledger.out_dir
        self.publish(stage_output(out_dir, self.cfg, out, self.planned_starts[out.shard.index]))

    def publish(self, staged: StagedOutput) -> None:
        """Rename the staged files into place, then append the ledger line that makes them count."""
        shard = staged.shard
        if staged.first_error and self.first_error is None:
            self.first_error = staged.first_error
        error_file = part = None
        if staged.errors:
            error_file = publish(self.ledger.errors_dir, staged.errors).name
        if staged.part:
            part = publish(self.ledger.out_dir, staged.part)
            crash_point("part-renamed")
        self.ledger.commit(shard.index, shard.start, shard.stop, part, staged.failed, error_file)
        rows_out = part.rows if part else 0
        self.stats.add_rows(rows_in=shard.num_rows, rows_out=rows_out, failed=staged.failed, shards=1)
        self.on_commit()
        total = self.failed_before + self.stats.rows_failed
        if total > self.budget:
            ex = self.cfg.execution
            raise ErrorBudgetExceeded(
                f"{total} rows failed, over the error budget of {self.budget} "
                f"(execution.max_error_rate={ex.max_error_rate} of {self.stats.rows_planned} rows"
                f"{'' if ex.max_errors is None else f', execution.max_errors={ex.max_errors}'}); "
                f"first: {self.first_error}; see {self.ledger.out_dir / ERRORS}/, fix the cause or raise "
                "the budget, then rerun"
            )


@dataclass(frozen=True)
class RetryUnit:
    """The failed rows of one error file, to run again (``--retry-errors``)."""

    commit: Commit
    shard: Shard
    rows: frozenset[int]


def retry_units(ledger: Ledger, planned: list[Shard], commits: list[Commit]) -> list[RetryUnit]:
    """One unit per error file in force, with the rows it lists (a shard-level record lists its whole range)."""
    plan = {s.index: s for s in planned}
    superseded = {c.replaces for c in commits if c.replaces}
    units = []
    for c in commits:
        if not c.error_file or c.error_file in superseded:
            continue
        rows: set[int] = set()
        for line in (ledger.errors_dir / c.error_file).read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                rows.update(range(int(rec["row"]), int(rec["row"]) + int(rec.get("rows", 1))))
        if rows:
            units.append(RetryUnit(c, replace(plan[c.shard], start=min(rows), stop=max(rows) + 1), frozenset(rows)))
    return units


@dataclass
class RetryCommitter:
    """Commits the rows of one retry unit: a new part beside the original, a new error file for
    the rows that still fail, and one ledger line that supersedes the old error file."""

    cfg: JobConfig
    ledger: Ledger
    stats: RunStats
    unit: RetryUnit
    on_commit: Callable[[], None] = lambda: None

    def __call__(self, out: ShardOutput) -> None:
        old = self.unit.commit.error_file
        assert old is not None
        stem = old.removesuffix(".jsonl")
        base, _, n = stem.partition(".retry-")
        name = f"{base}.retry-{int(n or 0) + 1}"
        error_file = None
        if out.errors:
            error_file = f"{name}.jsonl"
            _write_errors(self.ledger, error_file, out.errors)
        part = None
        if out.table.num_rows:
            fmt = self.cfg.sink.format
            part = write_part(self.ledger.out_dir, name + EXTENSIONS[fmt], out.table, fmt, self.cfg.sink.compression)
        c = self.unit.commit
        failed = _failed(out.errors)
        self.ledger.commit(c.shard, c.start, c.stop, part, failed, error_file, replaces=old)
        (self.ledger.errors_dir / old).unlink(missing_ok=True)
        self.stats.add_rows(rows_in=len(self.unit.rows), rows_out=out.table.num_rows, failed=failed, shards=1)
        self.on_commit()
