"""One job, start to finish, in four steps: plan, lock, execute, report.

This is the library entry point behind ``bulkinfer run``::

    from bulkinfer import load_config, run_job
    result = run_job(load_config("job.toml"))

Each step is a function a test can call: :func:`prepare` (model, adapter, batch size),
:func:`~bulkinfer.plan.make_plan` under the output's lock, :func:`resume` (what is
already committed), :func:`execute` (the runner over what is left) and the report.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .adapters import Adapter, ResolvedModel
from .commit.committer import Committer, PartStamp, RetryCommitter, remaining_work, retry_units
from .commit.finish import finish
from .commit.ledger import CommitTally, Ledger, OutputLedger
from .commit.repair import rebuild_ledger
from .commit.routing import compile_routes
from .commit.spend import CostGuard
from .commit.topk import Best
from .config import JobConfig
from .core.errors import CheckFailed, ConfigError, CostLimitReached, ErrorBudgetExceeded, Interrupted
from .core.hardware import emulation_warning
from .core.layout import HASH_COLUMN
from .core.storage import storage_options_for
from .plan import JobPlan, job_identity, make_plan
from .precision.gate import GateVerdict, job_quality_gate
from .precision.settle import Settled, for_workers, settle, with_column_types
from .report import Progress, RunStats, write_report
from .report.drift import drift_against, drift_line, load_baseline
from .report.lineage import Lineage
from .report.live import RunMetrics
from .report.publish import instance_price, load_output_stats
from .runners import make_runner
from .runners.contract import PassesTogether, Runner
from .runners.ray import auto_on_cluster
from .sinks import ExportTarget, Sink, make_exports, make_route_targets, make_sink
from .sources import Shard, ShardTable, reading_in_order

if TYPE_CHECKING:
    from .precision.gate import GateFigures

__all__ = ["Prepared", "RunResult", "execute", "job_identity", "prepare", "resume", "run_job"]

log = logging.getLogger("bulkinfer")


@dataclass(frozen=True)
class RunResult:
    """What ``run_job`` returns: where the output is and the report's figures."""

    output: Path | str  # a folder, or an object-store URI
    status: str
    report: dict[str, Any]


Prepared = Settled
"""What :func:`prepare` returns: the settled config, the model and the (not yet set up) adapter."""


def prepare(cfg: JobConfig) -> Prepared:
    """Settle the job's config (:func:`bulkinfer.precision.settle.settle`: model, precision,
    adapter, batch size, incremental fallback) and check it (nothing heavy is loaded yet)."""
    cfg.require_runnable()
    settled = settle(cfg, on_cluster=auto_on_cluster if cfg.execution.backend == "ray" else None)
    cfg, model, adapter = settled.cfg, settled.model, settled.adapter
    instance_price(cfg)  # an unknown cost.instance is one line before any work
    slow = emulation_warning(cfg.runtime.device, cfg.runtime.precision) if model.kind == "text-embedding" else None
    if slow:
        from .precision.tune import measured_here

        figures = measured_here(cfg, model.digest)
        log.warning("%s%s", slow, f" ({figures})" if figures else "")
    if cfg.sink.format == "parquet" and cfg.sink.preserve_order is False and not cfg.passthrough_columns:
        log.info("output order is not the input order and no id column is kept")
    if any(not c for c in adapter.input_columns):
        raise ConfigError("model: the adapter names an empty input column")
    return settled


def run_job(
    cfg: JobConfig,
    *,
    stop: threading.Event | None = None,
    retry_errors: bool = False,
    model: Adapter | None = None,
    on_commit: Callable[[RunStats], None] | None = None,
) -> RunResult:
    """Run (or resume) the job ``cfg`` describes; return when every shard is committed.

    Raises a :class:`~bulkinfer.core.errors.BulkinferError` on failure, ``Interrupted`` when
    stopped by a signal or by ``stop``: rerunning the same job resumes it. With
    ``retry_errors``, only the rows recorded in ``_errors/`` run again (after the cause
    was fixed); those that succeed leave ``_errors/``, those that fail again stay.
    ``model``: an adapter the caller set up already, for the model ``cfg`` settles to (the
    batch service's jobs share the server's model); the job uses it instead of building its
    own, and neither sets it up again nor closes it. ``on_commit`` sees the run's counters
    after each commit.
    """
    stop = stop or threading.Event()
    # from the start: a signal while the model loads or the plan is made exits 75 too; the
    # inputs' storage options are this job's own (jobs in one process each see theirs); a Parquet
    # row group larger than a shard is decoded once for all its shards
    options = storage_options_for(cfg.source.storage_options, cfg.source.paths)
    with _signals(stop), options, reading_in_order():
        return _run_job(cfg, stop, retry_errors, model, on_commit)


def _run_job(
    cfg: JobConfig,
    stop: threading.Event,
    retry_errors: bool,
    model: Adapter | None,
    on_commit: Callable[[RunStats], None] | None,
) -> RunResult:
    job = prepare(cfg)
    if model is not None:
        job = Prepared(job.cfg, job.model, model)
    baseline = load_baseline(job.cfg.monitor.baseline)
    sink = make_sink(job.cfg)
    sink.start()
    with open_ledger(sink) as ledger:
        plan, stats, left = _planned(job, ledger, retry_errors)
        lineage = Lineage(job.cfg, plan, job.model, str(sink.out_dir))
        lineage.start()
        guard = CostGuard(job.cfg, stats, stop)
        exports, route_targets = make_exports(job.cfg), make_route_targets(job.cfg)
        every_target = exports + [t for ts in route_targets.values() for t in ts]
        metrics = RunMetrics(job.cfg, stats)
        # execute
        status, done, failure = "complete", False, ""
        try:
            metrics.start()
            for target in every_target:  # a target that is down is one line before any inference
                target.start(plan, job.cfg.passthrough_columns)
            done = execute(
                job, plan, ledger, sink, stats, left, stop, exports, route_targets,
                retry_errors=retry_errors,
                on_commit=guard.check if on_commit is None else _both(guard.check, lambda: on_commit(stats)),
            )  # fmt: skip
            if done:
                for target in every_target:
                    target.complete()
        except Interrupted:
            status = "interrupted"
            if guard.tripped:
                raise CostLimitReached(f"{sink.out_dir}: {guard.tripped}") from None
            raise
        except BaseException as exc:
            status, failure = "failed", f"{type(exc).__name__}: {exc}"
            raise
        finally:  # report, whatever happened
            for target in every_target:
                target.close()
            sink.complete() if status == "complete" else sink.failed()
            report = _report(job, ledger, plan, stats, status, baseline)
            metrics.finish(status)
            if status == "interrupted":
                lineage.abort(report)
            elif status == "failed":
                lineage.fail(failure, report)
        if done:
            finish(job.cfg, cfg.source.previous, plan, ledger, report)
            lineage.complete(report, stats.output.schema)
    _after(job, stats, report, sink.out_dir, done)
    return RunResult(sink.out_dir, status, report)


def _planned(job: Prepared, ledger: OutputLedger, retry_errors: bool) -> tuple[JobPlan, RunStats, Left]:
    """The plan (or the plan of the run this one resumes), and what is left of it; the time
    planning took is the report's ``setup_split.plan_s``."""
    t0 = time.perf_counter()
    stored = ledger.read_plan()  # job.json, read once under the lock
    draft = make_plan(job.cfg, job.model, job.adapter, stored, retry_errors=retry_errors)
    plan = ledger.begin(draft, job.cfg.execution.overwrite, stored)
    plan_s = time.perf_counter() - t0
    stats, left = resume(job.cfg, ledger, plan)
    stats.setup_split["plan_s"] = plan_s
    return plan, stats, left


def _report(
    job: Prepared, ledger: OutputLedger, plan: JobPlan, stats: RunStats, status: str, baseline: Any
) -> dict[str, Any]:
    """The run's ``report.json`` (written whatever happened), with drift against the baseline
    when the run completed."""
    stats.finished = stats.finished or time.perf_counter()
    if baseline is not None and status == "complete":
        stats.drift = drift_against(baseline, stats, job.cfg)
    engine = getattr(job.adapter, "engine_name", job.cfg.runtime.engine)
    return write_report(
        job.cfg, ledger, stats, status, plan.fingerprint, plan.model_kind, engine, _bytes(ledger),
        runs_on=getattr(job.adapter, "runs_on", None),
    )  # fmt: skip


def _after(job: Prepared, stats: RunStats, report: dict[str, Any], out_dir: Any, done: bool) -> None:
    """What follows a committed run: the truncation warning, the job's index, the drift check."""
    if stats.rows_truncated:
        limit = getattr(getattr(job.adapter, "inner", job.adapter), "max_seq_length", None)
        log.warning(
            "%d row(s) had texts over the model's limit of %s tokens and were embedded from their first %s "
            "(report.json rows_truncated; model.truncate = false makes them error rows)",
            stats.rows_truncated, limit, limit,
        )  # fmt: skip
    if done and job.cfg.index.output:
        report["index"] = build_job_index(job.cfg, out_dir)
    if stats.drift and stats.drift["status"] == "drift" and job.cfg.monitor.fail_on_drift:
        raise CheckFailed(
            f"{out_dir}: drift against {job.cfg.monitor.baseline}: {drift_line(stats.drift)}; "
            "the output is committed and kept (see _bulkinfer/report.json)"
        )


def _bytes(ledger: OutputLedger) -> int:
    """The committed parts' bytes (0 when the ledger cannot be read: the report never hides the outcome)."""
    try:
        return sum(c.bytes for c in ledger.iter_commits())
    except Exception:  # a report figure, not a decision
        return 0


def build_job_index(cfg: JobConfig, out_dir: Path | str) -> dict[str, Any]:
    """``[index]``: the index over the finished output (after its lock is released)."""
    from dataclasses import asdict

    from .outputs.index import IndexSpec, build_index

    ix = cfg.index
    assert ix.output is not None
    spec = IndexSpec(column=ix.column, kind=ix.kind, metric=ix.metric)
    report = build_index(out_dir, Path(ix.output).expanduser(), spec, ix.min_recall)
    log.info(
        "index %s: recall@%d %.4f, %d vectors, built in %.1f s",
        report.index,
        report.k,
        report.recall,
        report.vectors,
        report.build_s,
    )
    return asdict(report)


def open_ledger(sink: Sink) -> OutputLedger:
    """The ledger of the sink's output: a folder's (flock, append-only log) or an object store's."""
    from .sinks.objects import ObjectSink

    if isinstance(sink, ObjectSink):
        from .commit.objledger import ObjectLedger

        return ObjectLedger(sink.store)
    return Ledger(Path(sink.out_dir))


@dataclass(frozen=True)
class Left:
    """What a resume leaves to run: the rows no commit covers, and the rows already failed (the
    commit records themselves are not kept: a million of them while the job runs)."""

    todo: ShardTable
    failed_rows: int


def resume(cfg: JobConfig, ledger: OutputLedger, plan: JobPlan) -> tuple[RunStats, Left]:
    """What the output already holds: the commits in force (after ``--repair`` when asked),
    with files no commit vouches for removed, and the run's counters started from them."""
    if ledger.took_over_from:
        log.info("took over the lock left by a run that died (%s)", ledger.took_over_from)
    if cfg.execution.repair:
        if not isinstance(ledger, Ledger):
            raise ConfigError(
                f"--repair: {ledger.out_dir}: an object-store output keeps one commit record per shard, "
                "never a log to repair; rerun without --repair"
            )
        rebuilt = rebuild_ledger(ledger)
        log.info("rebuilt the ledger from %d committed file(s)", len(rebuilt))
    committed = CommitTally.of(ledger.iter_commits(), keep_records=ledger.holds_records)  # folded as read
    in_table: set[str] = set()
    if cfg.sink.format == "delta":  # parts a Delta commit added stay, even before their ledger line
        from .sinks.delta import table_files

        in_table = table_files(ledger.out_dir)
    removed = ledger.remove_uncommitted(committed, in_table)
    if removed:
        log.info("removed %d uncommitted file(s) left by an earlier run", len(removed))
    todo = remaining_work(plan.shards, committed)
    stats = RunStats(
        rows_planned=plan.rows,
        shards_planned=len(plan.shards),
        rows_already_done=plan.rows - todo.rows(),
        shards_already_done=len(plan.shards) - len(np.unique(todo.indexes())),
    )
    skip = [*cfg.passthrough_columns, HASH_COLUMN]
    stats.output = load_output_stats(ledger, committed.names, cfg.sink.format, skip)
    stats.empty_inputs = [f.uri for f in plan.inputs if f.size == 0]
    for uri in stats.empty_inputs:  # a truncated upload looks exactly like this: said, never silent
        log.warning("%s: the file is empty (0 bytes): it adds no rows; check the upload if rows were expected", uri)
    if plan.input_errors:
        ledger.write_input_errors(plan.input_errors)
        for e in plan.input_errors:
            log.warning("skipped %s", e.message)
    return stats, Left(todo, committed.failed_rows)


Pass = tuple[Sequence[Shard], Committer | RetryCommitter, frozenset[int] | None]
"""Shards, the committer their outputs go to, and the rows to run (None: all)."""


def execute(
    job: Prepared,
    plan: JobPlan,
    ledger: OutputLedger,
    sink: Sink,
    stats: RunStats,
    left: Left,
    stop: threading.Event,
    exports: list[ExportTarget] | None = None,
    route_targets: dict[str, list[ExportTarget]] | None = None,
    *,
    retry_errors: bool = False,
    on_commit: Callable[[], None] = lambda: None,
) -> bool:
    """Run what is left of ``plan`` on the configured backend; True when every planned row is committed."""
    # every reader (local threads, Ray workers) converts to the plan's types
    cfg = with_column_types(job.cfg, plan.column_types)
    failed_before = left.failed_rows + len(plan.input_errors)
    exports, route_targets = exports or [], route_targets or {}
    routes = compile_routes(cfg)
    committer = Committer(ledger, sink, stats, cfg, plan.planned_starts, failed_before, exports=exports, routes=routes,
                          route_targets=route_targets, stamp=part_stamp(cfg, job.model, plan))  # fmt: skip
    if retry_errors:
        passes, backend = _retry_passes(ledger, sink, stats, plan, committer), "local"  # a few files: no cluster
    elif committer.failed_before > committer.budget:
        raise ErrorBudgetExceeded(
            f"{committer.failed_before} rows already failed, over the error budget of {committer.budget}; "
            f"see {ledger.errors_dir}/, fix the cause or raise execution.max_error_rate, then rerun"
        )
    else:
        passes, backend = ([(left.todo, committer, None)] if left.todo else []), cfg.execution.backend
    if passes and stop.is_set():  # stopped while planning or starting: nothing is in flight
        raise Interrupted(_interrupted(ledger.out_dir))
    if passes:

        def gate(figures_of: GateFigures | None = None) -> GateVerdict:
            return GateVerdict(*job_quality_gate(cfg, job.adapter, job.model, plan.shards, ledger, figures_of))

        runner_cfg = cfg
        if backend in ("ray", "spark"):  # workers write to the same output, whatever their working directory
            out = sink.out_dir
            runner_cfg = for_workers(cfg, out if isinstance(out, str) else str(Path(out).resolve()))
        runner = make_runner(runner_cfg, job.adapter, stats, stop, backend, ledger)
        stats.quality = runner.start(gate).figures  # the report's copy of the verdict
        try:
            with _running(stats, stop, cfg, ledger.out_dir) as progress:
                runner.on_progress = progress.update
                for _shards, commit, _rows in passes:
                    commit.on_commit = _both(progress.update, on_commit)
                _run_passes(runner, passes, stop)
                stats.finished = time.perf_counter()  # the last commit; tearing workers down is not the job's time
                stats.dedupe = getattr(runner, "dedupe", cfg.runtime.dedupe)
        finally:
            runner.close()
    return not remaining_work(plan.shards, ledger.iter_commits())


def _run_passes(runner: Runner, passes: list[Pass], stop: threading.Event) -> None:
    """Each pass in turn, or every pass at once where the runner takes them so (a remote Batch API)."""
    if isinstance(runner, PassesTogether):
        runner.run_passes(passes)
        return
    for shards, commit, rows in passes:
        runner.run(shards, commit, rows)
        if stop.is_set():
            break


def _retry_passes(ledger: OutputLedger, sink: Sink, stats: RunStats, plan: JobPlan, committer: Committer) -> list[Pass]:
    """--retry-errors: one pass per error file, its failed rows only, committed by a
    :class:`RetryCommitter` with the job's exports, routes and part stamp."""
    units = retry_units(ledger, plan.shards, ledger.commits())
    log.info("retrying %d failed row(s) from %d error file(s)", sum(len(u.rows) for u in units), len(units))
    stats.rows_planned = stats.rows_already_done = 0
    return [
        ([u.shard], RetryCommitter(ledger, sink, stats, u, exports=committer.exports, routes=committer.routes,
                                   route_targets=committer.route_targets, stamp=committer.stamp), u.rows)
        for u in units
    ]  # fmt: skip


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def call() -> None:
        first()
        second()

    return call


def part_stamp(cfg: JobConfig, model: ResolvedModel, plan: JobPlan) -> PartStamp:
    """Statistics skip the passthrough columns; every part carries the job's provenance (and,
    with ``sink.top_k``, only its shard's best K rows)."""
    from ._version import __version__

    provenance = {
        "bulkinfer_version": __version__,
        "job_fingerprint": plan.fingerprint,
        "model": model.location,
        "model_kind": plan.model_kind,
        "model_digest": model.digest,
        "precision": cfg.runtime.precision,
        "engine": cfg.runtime.engine,
    }
    skip = (*cfg.passthrough_columns, HASH_COLUMN)  # statistics describe the model's columns only
    return PartStamp(skip, provenance, Best.of(cfg.sink.top_k, cfg.source.id_column))


@contextmanager
def _running(stats: RunStats, stop: threading.Event, cfg: JobConfig, out_dir: Path) -> Iterator[Progress]:
    """Progress display and signal handling around a run; ``Interrupted`` once stopped."""
    # the job's handlers again: the runner's start-up may have replaced them (ray.init installs its own)
    with Progress(stats, cfg.execution.progress, cfg.execution.log_interval_s) as progress, _signals(stop):
        yield progress
    if stop.is_set():
        raise Interrupted(_interrupted(out_dir))


def _interrupted(out_dir: Path | str) -> str:
    return f"{out_dir}: interrupted; committed rows are kept, rerun the same command to resume"


@contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    """First SIGTERM/SIGINT: stop taking work, exit 75. Second: leave at once (still exit 75)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            import os

            os._exit(Interrupted.exit_code)
        log.warning(
            "signal %s: finishing committed work, then exiting (75); send again to exit now",
            signal.Signals(signum).name,
        )
        stop.set()

    old: dict[int, Callable[..., Any] | int | None] = {
        s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
