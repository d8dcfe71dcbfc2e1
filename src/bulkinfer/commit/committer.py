"""Turn a finished shard into committed output: the sink stages and publishes its files,
then the ledger line makes them count; keep the error budget.

Order matters: ``_errors/part-….jsonl`` and ``part-….parquet`` are each staged under a
hidden name and published; only the ledger line, appended last, makes them count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.execution import error_budget
from ..core.errors import ErrorBudgetExceeded
from ..core.faults import crash_point
from ..core.layout import ERRORS, STATS
from ..core.records import decode_records
from ..report.columns import describe
from ..sources.shardtable import ShardTable
from .ledger import Commit, CommitTally, OutputLedger
from .routing import DEFAULT, Route, split
from .topk import Best

if TYPE_CHECKING:
    import pyarrow as pa

    from ..config import JobConfig
    from ..report import RunStats
    from ..sinks import Sink, StagedOutput
    from ..sinks.exports import ExportTarget
    from ..sinks.lifecycle import Published
    from ..sources import Shard
    from ..sources.shard import ShardOutput

__all__ = [
    "PROVENANCE_KEY",
    "Committer",
    "PartStamp",
    "RetryCommitter",
    "RetryUnit",
    "remaining_work",
    "retry_units",
    "stage_routed",
]


def remaining_work(planned: Sequence[Shard], commits: Iterable[Commit] | CommitTally) -> ShardTable:
    """The row ranges of ``planned`` that no commit covers, as shards: a shard no commit touches
    is itself, a tail keeps its index. The commits are folded into three integer arrays as they
    are read (24 bytes a commit), never held as records, and the work left is a
    :class:`ShardTable` (columns): a million-shard job's resume and end."""
    tally = commits if isinstance(commits, CommitTally) else CommitTally.of(commits, names=False)
    assert tally.has_ranges, "a tally folded without its row ranges cannot say what is left"
    s, a, b = (
        np.frombuffer(x, dtype=np.int64) if len(x) else np.zeros(0, np.int64)
        for x in (tally.shard, tally.start, tally.stop)
    )
    order = np.lexsort((a, s))
    s, a, b = s[order], a[order], b[order]
    index = np.fromiter((p.index for p in planned), np.int64, len(planned))
    first, end = np.searchsorted(s, index, "left").tolist(), np.searchsorted(s, index, "right").tolist()
    todo = ShardTable()
    for p, i, j in zip(planned, first, end, strict=True):
        if i == j:
            todo.append(p)
            continue
        pos = p.start
        for lo, hi in zip(a[i:j].tolist(), b[i:j].tolist(), strict=True):
            if lo > pos:
                todo.append(replace(p, start=pos, stop=min(lo, p.stop)))
            pos = max(pos, hi)
        if pos < p.stop:
            todo.append(replace(p, start=pos))
    return todo


@dataclass(frozen=True)
class PartStamp:
    """What every part carries besides its rows: its column statistics (of every column but
    the passthrough ones in ``skip``) and, in Parquet key-value metadata under ``bulkinfer``,
    its provenance (the job's, plus the input file and row range), so a part copied elsewhere
    still says where it came from; with ``best`` (``sink.top_k``), only its shard's best K rows."""

    skip: tuple[str, ...] = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)
    best: Best | None = None

    def stamp(self, table: pa.Table, shard: Shard) -> pa.Table:
        if not self.provenance:
            return table
        mine = {**self.provenance, "input": shard.uri, "input_rows": [shard.start, shard.stop], "shard": shard.index}
        meta = {**(table.schema.metadata or {}), PROVENANCE_KEY: json.dumps(mine, sort_keys=True).encode()}
        return table.replace_schema_metadata(meta)


PROVENANCE_KEY = b"bulkinfer"

STATS_EVERY_S = 10.0
"""How often the committed parts' column statistics are saved (``_bulkinfer/stats.json``) while a
job runs, so a resume after a kill recomputes those of at most this long's parts from their files
(all of them, before: a resume at 500,000 parts read every part again). A save names every part
it covers, so it grows with the job: saves are spaced to at least :data:`STATS_SPACING` times the
last one's duration (at most 5% of the job's time)."""

STATS_SPACING = 20


def stage_routed(
    sink: Sink,
    routes: list[Route],
    out: ShardOutput,
    start: int | None,
    tag: str = "",
    name: str | None = None,
    stamp: PartStamp | None = None,
) -> tuple[StagedOutput, pa.Table, dict[str, pa.Table]]:
    """Split a shard's rows by route (first match), stage the default route's rows as the part,
    stamped with its provenance and carrying its column statistics; return the staged part,
    its rows and each route's rows (for the driver to write)."""
    stamp = stamp or PartStamp()
    rest, routed = split(routes, out.table) if routes else (out.table, {})
    if stamp.best is not None:
        rest = stamp.best.rows(rest, "the model's output")
    staged = sink.stage(replace(out, table=stamp.stamp(rest, out.shard)), start, tag, name)
    if staged.part is not None:
        staged = replace(staged, stats=describe(rest, stamp.skip))
    return staged, rest, routed


def publish_and_export(
    sink: Sink,
    targets: list[ExportTarget],
    staged: StagedOutput,
    table: pa.Table | None,
    stats: RunStats,
    routed: Mapping[str, pa.Table] | None = None,
    route_targets: Mapping[str, list[ExportTarget]] | None = None,
) -> Published:
    """Publish a shard's staged files, then write its rows to every export target and each
    route's rows to that route's targets: all of it before the ledger line, so a crash
    anywhere here means the shard is replayed. When a target fails, the published files are
    withdrawn before the error goes on: a reader never sees a part that no ledger line vouches
    for (a process killed outright leaves it to the next run, which removes it)."""
    published = sink.publish(staged)
    try:
        if targets and published.part is not None:
            if table is None:
                raise AssertionError("export targets need the part's rows: the runner must hand them over")
            for target in targets:
                _timed_write(target, published.part.name, table, stats)
        if routed:
            stats.add_route(DEFAULT, published.part.rows if published.part else 0)
            for route, rows in routed.items():
                stats.add_route(route, rows.num_rows)
                for target in (route_targets or {}).get(route, []):
                    _timed_write(target, staged.unit, rows, stats)
    except BaseException:  # a target refused or failed, or the run was stopped: no part stays visible uncommitted
        sink.withdraw(staged, published)
        raise
    crash_point("exported")
    return published


def commit_or_withdraw(
    sink: Sink, ledger: OutputLedger, staged: StagedOutput, published: Published, record: Commit
) -> None:
    """Append the ledger line; when that fails, withdraw the published files unless the line
    made it after all (a failure after the write): a part is never visible without its line,
    and a line never loses its part."""
    commit_many_or_withdraw(sink, ledger, [(staged, published, record)])


def commit_many_or_withdraw(
    sink: Sink, ledger: OutputLedger, done: Sequence[tuple[StagedOutput, Published, Commit]]
) -> None:
    """:func:`commit_or_withdraw` for a group: one ledger append for all; when it fails, the
    published files of the records that did not make it are withdrawn."""
    try:
        ledger.commit_many([record for _, _, record in done])
    except BaseException:
        try:
            written = set(ledger.commits())
        except Exception:  # the ledger cannot be read either: the next run decides what no line vouches for
            written = {record for _, _, record in done}
        for staged, published, record in done:
            if record not in written:
                sink.withdraw(staged, published)
        raise


def _timed_write(target: ExportTarget, part: str, table: pa.Table, stats: RunStats) -> None:
    t0 = time.perf_counter()
    target.write(part, table)
    stats.add_export(target.name, table.num_rows, time.perf_counter() - t0)


@dataclass
class CommitterBase:
    """What both committers share: where parts go (``sink``), where commits are recorded
    (``ledger``), the run's counters, the export targets and routes each part also goes to, the
    stamp every part carries, and who is told after each commit."""

    ledger: OutputLedger
    sink: Sink
    stats: RunStats
    exports: list[ExportTarget] = field(default_factory=list, kw_only=True)
    routes: list[Route] = field(default_factory=list, kw_only=True)
    route_targets: dict[str, list[ExportTarget]] = field(default_factory=dict, kw_only=True)
    stamp: PartStamp = field(default_factory=PartStamp, kw_only=True)
    on_commit: Callable[[], None] = field(default=lambda: None, kw_only=True)

    def discard(self, staged: StagedOutput) -> None:
        """Drop an attempt that will not be committed (another attempt committed its rows)."""
        self.sink.discard(staged)

    def _publish_files(
        self, staged: StagedOutput, table: pa.Table | None, routed: Mapping[str, pa.Table] | None
    ) -> tuple[Published, int]:
        """The staged files published, ``table`` exported and ``routed`` sent to the routes'
        targets (before the ledger line); the rows routed."""
        published = publish_and_export(self.sink, self.exports, staged, table, self.stats, routed, self.route_targets)
        return published, sum(t.num_rows for t in (routed or {}).values())

    def _counted(self, staged: StagedOutput, published: Published, rows_in: int, n_routed: int) -> None:
        """After the ledger line: the part revealed, and the run's figures."""
        self.sink.reveal(staged)
        part = published.part
        if part is not None:
            self.stats.output.add(part.name, staged.stats)
        rows_out = (part.rows if part else 0) + n_routed
        self.stats.add_rows(rows_in=rows_in, rows_out=rows_out, failed=staged.failed, shards=1)


@dataclass
class Committer(CommitterBase):
    """Commits shard outputs for one run; raises once the error budget is spent."""

    cfg: JobConfig
    planned_starts: Mapping[int, int]
    failed_before: int
    first_error: str | None = field(default=None, init=False)
    _first_at: int | None = field(default=None, init=False)  # first_error's shard (shards commit out of order)
    _stats_saved: float = field(default_factory=time.monotonic, init=False)
    _stats_every: float = field(default_factory=lambda: STATS_EVERY_S, init=False)

    @property
    def budget(self) -> int:
        return error_budget(self.cfg.execution, self.stats.rows_planned)

    def __call__(self, out: ShardOutput) -> None:
        self.publish(*stage_routed(self.sink, self.routes, out, self.name_start(out.shard), stamp=self.stamp))

    def name_start(self, shard: Shard) -> int | None:
        """The row that names ``shard``'s files: None for a whole planned shard, its start for a tail."""
        return None if shard.start == self.planned_starts[shard.index] else shard.start

    def publish(
        self, staged: StagedOutput, table: pa.Table | None = None, routed: Mapping[str, pa.Table] | None = None
    ) -> None:
        """Publish the staged files, write ``table`` (the part's rows) to the export targets and
        ``routed`` to the routes' targets, then append the ledger line that makes them count."""
        t0 = time.perf_counter()
        published, n_routed = self._publish_files(staged, table, routed)
        record = self._record(staged, published, n_routed)
        commit_or_withdraw(self.sink, self.ledger, staged, published, record)
        self._committed(staged, published, n_routed)
        self.stats.commit_s += time.perf_counter() - t0
        self._check_budget()

    def publish_many(self, staged: Sequence[StagedOutput]) -> None:
        """Commit several shards staged elsewhere together (a cluster's driver): their files put
        in place with one directory fsync, then one ledger append for all. Only when
        :attr:`groups` (a job with export targets or routes commits shard by shard)."""
        if self.exports or self.routes:
            raise AssertionError("publish_many is for shards without export targets or routes")
        t0 = time.perf_counter()
        published = self.sink.publish_many(staged)
        for _ in staged:
            crash_point("exported")  # the point each shard passes in publish_and_export
        done = [(s, p, self._record(s, p, 0)) for s, p in zip(staged, published, strict=True)]
        commit_many_or_withdraw(self.sink, self.ledger, done)
        for s, p, _ in done:
            self._committed(s, p, 0)
        self.stats.commit_s += time.perf_counter() - t0
        self._check_budget()

    @property
    def groups(self) -> bool:
        """Whether :meth:`publish_many` may take several shards at once."""
        return not (self.exports or self.routes)

    def _record(self, staged: StagedOutput, published: Published, n_routed: int) -> Commit:
        shard = staged.shard
        if staged.first_error and (self._first_at is None or shard.index < self._first_at):
            self.first_error, self._first_at = staged.first_error, shard.index  # the first bad row in file order
        return Commit.of(
            shard.index, shard.start, shard.stop, published.part, staged.failed, published.error_file, routed=n_routed
        )

    def _committed(self, staged: StagedOutput, published: Published, n_routed: int) -> None:
        """After the ledger line: the part revealed, the run's figures, now and then stats.json."""
        self._counted(staged, published, staged.shard.num_rows, n_routed)
        if time.monotonic() - self._stats_saved >= self._stats_every:
            t0 = time.monotonic()
            self.ledger.write_private(STATS, self.stats.output.to_json())  # covers committed parts only
            self._stats_saved = time.monotonic()
            self._stats_every = max(STATS_EVERY_S, STATS_SPACING * (self._stats_saved - t0))
        self.on_commit()

    def _check_budget(self) -> None:
        total = self.failed_before + self.stats.rows_failed
        if total > self.budget:
            ex = self.cfg.execution
            raise ErrorBudgetExceeded(
                f"{total} rows failed, over the error budget of {self.budget} "
                f"(execution.max_error_rate={ex.max_error_rate} of {self.stats.rows_planned} rows, "
                f"at least min_error_budget={ex.min_error_budget} up to half of them"
                f"{'' if ex.max_errors is None else f', execution.max_errors={ex.max_errors}'}); "
                f"first: {self.first_error}; see {self.ledger.out_dir}/{ERRORS}/, fix the cause or raise "
                "the budget, then rerun"
            )


@dataclass(frozen=True)
class RetryUnit:
    """The failed rows of one error file, to run again (``--retry-errors``)."""

    commit: Commit
    shard: Shard
    rows: frozenset[int]


def retry_units(ledger: OutputLedger, planned: Sequence[Shard], commits: list[Commit]) -> list[RetryUnit]:
    """One unit per error file in force, with the rows it lists (a shard-level record lists its whole range)."""
    plan = {s.index: s for s in planned}
    superseded = {c.replaces for c in commits if c.replaces}
    units = []
    for c in commits:
        if not c.error_file or c.error_file in superseded:
            continue
        rows: set[int] = set()
        for rec in decode_records(ledger.read_error_file(c.error_file)):
            rows.update(rec.row_numbers())
        if rows:
            units.append(RetryUnit(c, replace(plan[c.shard], start=min(rows), stop=max(rows) + 1), frozenset(rows)))
    return units


@dataclass
class RetryCommitter(CommitterBase):
    """Commits the rows of one retry unit: a new part beside the original, a new error file for
    the rows that still fail, and one ledger line that supersedes the old error file."""

    unit: RetryUnit

    def __call__(self, out: ShardOutput) -> None:
        old = self.unit.commit.error_file
        assert old is not None
        base, _, n = old.removesuffix(".jsonl").partition(".retry-")
        name = f"{base}.retry-{int(n or 0) + 1}"
        self.publish(*stage_routed(self.sink, self.routes, out, None, name=name, stamp=self.stamp))

    def name_start(self, shard: Shard) -> int | None:
        return None  # retry parts are named after the error file they supersede

    @property
    def groups(self) -> bool:
        return False  # one unit, one ledger line that supersedes its error file

    def publish_many(self, staged: Sequence[StagedOutput]) -> None:
        for s in staged:
            self.publish(s)

    def publish(
        self, staged: StagedOutput, table: pa.Table | None = None, routed: Mapping[str, pa.Table] | None = None
    ) -> None:
        """Publish the retried rows (and export or route them), then the ledger line that
        supersedes the old error file."""
        old = self.unit.commit.error_file
        assert old is not None
        published, n_routed = self._publish_files(staged, table, routed)
        c = self.unit.commit
        record = Commit.of(c.shard, c.start, c.stop, published.part, staged.failed, published.error_file, old, n_routed)
        commit_or_withdraw(self.sink, self.ledger, staged, published, record)
        self._counted(staged, published, len(self.unit.rows), n_routed)
        self.ledger.delete_error_file(old)
        self.on_commit()
