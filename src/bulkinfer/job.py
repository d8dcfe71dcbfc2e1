"""One job, start to finish: plan, skip what is committed, run the rest, commit, report.

This is the library entry point behind ``bulkinfer run``::

    from bulkinfer import load_config, run_job
    result = run_job(load_config("job.toml"))
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from . import __version__
from .adapters import available_cpus, build_adapter, job_setup_context, resolve_model
from .committer import Committer, RetryCommitter, remaining_work, retry_units
from .config import JobConfig
from .errors import ConfigError, ErrorBudgetExceeded, Interrupted, OutputError, SourceError
from .ledger import Ledger, active_error_files, failed_rows
from .quality import quality_gate, sample_rows
from .repair import rebuild_ledger
from .report import Progress, RunStats, write_prometheus
from .runners import LocalRunner
from .schema import type_name
from .sources import Shard, check_columns, head_schema, list_inputs, plan_shards, settle_types

__all__ = ["RunResult", "job_identity", "resolve_batch_size", "run_job"]

log = logging.getLogger("bulkinfer")

# Fields that change what is written. The others (batch size, threads, progress...) may
# change between a crash and its resume.
_IDENTITY_FIELDS = {
    "source": ("format", "id_column", "shard_rows", "column_types"),
    "model": ("kind", "text_column", "feature_columns", "max_seq_length", "options"),
    "runtime": ("engine", "precision"),
    "sink": ("format", "keep_columns", "preserve_order", "compression"),
    "execution": ("limit_rows",),
}


@dataclass(frozen=True)
class RunResult:
    """What ``run_job`` returns: where the output is and the report's figures."""

    output: Path
    status: str
    report: dict[str, Any]


def job_identity(cfg: JobConfig) -> dict[str, Any]:
    dumped = cfg.model_dump(mode="json")
    return {f"{sec}.{k}": dumped[sec][k] for sec, keys in _IDENTITY_FIELDS.items() for k in keys}


def _fingerprint(identity: dict[str, Any], model_digest: str, inputs: list[dict[str, Any]]) -> str:
    body = json.dumps({"identity": identity, "model": model_digest, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def _retry_fingerprint(
    existing: dict[str, Any], identity: dict[str, Any], inputs: list[dict[str, Any]], digest: str
) -> str:
    """A retry may run a fixed model (new code or options) over the failed rows, never other inputs."""
    same_inputs = existing.get("inputs") == inputs
    old_identity = {k: v for k, v in existing.get("identity", {}).items() if k != "model.options"}
    new_identity = {k: v for k, v in identity.items() if k != "model.options"}
    if not same_inputs or old_identity != new_identity:
        return _fingerprint(identity, digest, inputs)  # begin() refuses it and says what changed
    if existing.get("model_digest") != digest or existing["identity"].get("model.options") != identity["model.options"]:
        log.warning("the model changed since these rows failed: retried rows use the new model, the others keep theirs")
    return str(existing["fingerprint"])


def _limit(shards: list[Shard], limit: int | None) -> list[Shard]:
    if limit is None:
        return shards
    out, left = [], limit
    for s in shards:
        if left <= 0:
            break
        out.append(replace(s, stop=min(s.stop, s.start + left)) if s.num_rows > left else s)
        left -= s.num_rows
    return out


def resolve_batch_size(cfg: JobConfig, model_digest: str, adapter: Any) -> JobConfig:
    """``cfg`` with a concrete ``runtime.batch_size``: "auto" becomes what ``tune`` measured,
    and a size left unset becomes the adapter's hint (large for cheap tabular models)."""
    if cfg.runtime.batch_size == "auto":
        from .tune import auto_batch_size

        size, why = auto_batch_size(cfg, model_digest)
        log.info("runtime.batch_size = auto: %d (%s)", size, why)
        return _with_batch(cfg, size)
    if "batch_size" not in cfg.runtime.model_fields_set and adapter.batch_size_hint:
        return _with_batch(cfg, adapter.batch_size_hint)
    return cfg


def _with_batch(cfg: JobConfig, size: int) -> JobConfig:
    return cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"batch_size": size})})


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

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_job(cfg: JobConfig, *, stop: threading.Event | None = None, retry_errors: bool = False) -> RunResult:
    """Run (or resume) the job ``cfg`` describes; return when every shard is committed.

    Raises a :class:`~bulkinfer.errors.BulkinferError` on failure, ``Interrupted`` when
    stopped by a signal or by ``stop``: rerunning the same job resumes it. With
    ``retry_errors``, only the rows recorded in ``_errors/`` run again (after the cause
    was fixed); those that succeed leave ``_errors/``, those that fail again stay.
    """
    cfg.require_runnable()
    stop = stop or threading.Event()
    started = time.time()
    model = resolve_model(cfg)
    adapter = build_adapter(cfg, model)
    cfg = resolve_batch_size(cfg, model.digest, adapter)
    passthrough = cfg.passthrough_columns
    if cfg.sink.format == "parquet" and cfg.sink.preserve_order is False and not passthrough:
        log.info("output order is not the input order and no id column is kept")
    inputs = list_inputs(cfg.source.paths, cfg.source.format)
    columns = list(dict.fromkeys([*adapter.input_columns, *passthrough]))
    heads = {f.uri: head_schema(f) for f in inputs}
    check_columns(heads, columns)
    identity = job_identity(cfg)
    input_records = [asdict(f) for f in inputs]
    fingerprint = _fingerprint(identity, model.digest, input_records)

    out_dir = Path(cfg.sink.path.removeprefix("file://")).expanduser()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{out_dir}: cannot create the output directory ({exc.strerror or exc})") from exc
    ledger = Ledger(out_dir)
    ledger.acquire()
    try:
        if ledger.took_over_from:
            log.info("took over the lock left by a run that died (%s)", ledger.took_over_from)
        existing = ledger.read_job()
        if retry_errors and existing is not None and existing.get("fingerprint") != fingerprint:
            fingerprint = _retry_fingerprint(existing, identity, input_records, model.digest)
        if existing is not None and existing.get("fingerprint") == fingerprint:
            shards = [Shard.from_json(s) for s in existing["shards"]]
            input_errors = existing.get("input_errors", [])
        else:
            problems: list[SourceError] = []
            shards = _limit(plan_shards(inputs, cfg.source.shard_rows, problems), cfg.execution.limit_rows)
            input_errors = [
                {
                    "input": str(p).split(": ", 1)[0],
                    "row": None,
                    "rows": 1,
                    "id": None,
                    "stage": "plan",
                    "error_type": "SourceError",
                    "message": str(p),
                }
                for p in problems
            ]
            if problems and not shards:
                raise problems[0]
        if existing is not None and existing.get("fingerprint") == fingerprint and "column_types" in existing:
            column_types = existing["column_types"]  # as the run that planned these shards read them
        else:  # the types the planned files start with; a file skipped at planning has no say
            settled = settle_types((heads[uri] for uri in dict.fromkeys(s.uri for s in shards)), columns)
            column_types = {**{c: n for c, t in settled.items() if (n := type_name(t))}, **cfg.source.column_types}
        job = {
            "fingerprint": fingerprint,
            "bulkinfer_version": __version__,
            "created": started,
            "identity": identity,
            "model": {"kind": model.kind, "location": model.location},
            "model_digest": model.digest,
            "inputs": input_records,
            "config": cfg.model_dump(mode="json"),
            "shards": [s.to_json() for s in shards],
            "input_errors": input_errors,
            "column_types": column_types,
        }
        job = ledger.begin(job, cfg.execution.overwrite)
        # every reader (local threads, Ray workers) converts to the same types
        cfg = cfg.model_copy(update={"source": cfg.source.model_copy(update={"column_types": column_types})})
        if cfg.execution.repair:
            rebuilt = rebuild_ledger(ledger)
            log.info("rebuilt the ledger from %d committed file(s)", len(rebuilt))
        committed = ledger.commits()
        removed = ledger.remove_uncommitted(committed)
        if removed:
            log.info("removed %d uncommitted file(s) left by an earlier run", len(removed))
        todo = remaining_work(shards, committed)
        stats = RunStats(
            rows_planned=sum(s.num_rows for s in shards),
            shards_planned=len(shards),
            rows_already_done=sum(s.num_rows for s in shards) - sum(s.num_rows for s in todo),
            shards_already_done=len(shards) - len({s.index for s in todo}),
        )
        if input_errors:
            ledger.write_input_errors(input_errors)
            for e in input_errors:
                log.warning("skipped %s", e["message"])
        failed_before = failed_rows(committed) + len(input_errors)
        committer = Committer(cfg, ledger, stats, {s.index: s.start for s in shards}, failed_before=failed_before)

        def gate() -> None:
            stats.quality = _quality_gate(cfg, adapter, model, shards, ledger)

        status = "complete"
        try:
            if retry_errors:
                units = retry_units(ledger, shards, committed)
                log.info("retrying %d failed row(s) from %d error file(s)", sum(len(u.rows) for u in units), len(units))
                stats.rows_planned = stats.rows_already_done = 0
                passes: list[Pass] = [([u.shard], RetryCommitter(cfg, ledger, stats, u), u.rows) for u in units]
                if passes:
                    _execute(cfg, adapter, passes, stats, stop, gate)
                todo = remaining_work(shards, ledger.commits())
            elif committer.failed_before > committer.budget:
                raise ErrorBudgetExceeded(
                    f"{committer.failed_before} rows already failed, over the error budget of {committer.budget}; "
                    f"see {ledger.errors_dir}/, fix the cause or raise execution.max_error_rate, then rerun"
                )
            elif todo and cfg.execution.backend == "ray":
                _execute_ray(cfg, adapter, todo, committer, stats, stop, gate)
                todo = []
            elif todo:
                _execute(cfg, adapter, [(todo, committer, None)], stats, stop, gate)
                todo = []
        except Interrupted:
            status = "interrupted"
            raise
        except BaseException:
            status = "failed"
            raise
        finally:
            stats.finished = stats.finished or time.perf_counter()
            engine = getattr(adapter, "engine_name", cfg.runtime.engine)
            report = _write_report(cfg, ledger, stats, status, fingerprint, model.kind, engine)
        if status == "complete" and not todo:
            _write_success(ledger, fingerprint, len(input_errors))
        return RunResult(out_dir, status, report)
    finally:
        ledger.release()


Pass = tuple[list[Shard], Any, frozenset[int] | None]
"""Shards, the committer their outputs go to, and the rows to keep (None: all)."""


def _execute(
    cfg: JobConfig,
    adapter: Any,
    passes: list[Pass],
    stats: RunStats,
    stop: threading.Event,
    gate: Callable[[], None] = lambda: None,
) -> None:
    adapter.setup(job_setup_context(cfg))
    gate()
    stats.mark_running()
    missing = [c for c in adapter.input_columns if not c]
    if missing:
        raise ConfigError("model: the adapter names an empty input column")
    runner = LocalRunner(cfg, adapter, stats, stop)
    with _running(cfg, stats, stop, passes[0][1].ledger.out_dir) as progress:
        runner.on_progress = progress.update
        try:
            for shards, committer, rows in passes:
                committer.on_commit = progress.update
                runner.run(shards, committer, rows)
                if stop.is_set():
                    break
        finally:
            adapter.close()


def _execute_ray(
    cfg: JobConfig,
    adapter: Any,
    shards: list[Shard],
    committer: Committer,
    stats: RunStats,
    stop: threading.Event,
    gate: Callable[[], None],
) -> None:
    """Run ``shards`` on Ray workers; the quality gate runs here, before any worker starts."""
    from .runners.ray import RayRunner

    runner = RayRunner(cfg, stats, stop)
    if cfg.runtime.precision != "fp32":
        adapter.setup(job_setup_context(cfg))
        try:
            gate()
        finally:
            adapter.close()
    ledger = committer.ledger
    runner.connect()
    try:
        with _running(cfg, stats, stop, ledger.out_dir) as progress:
            committer.on_commit = progress.update
            runner.run(shards, committer)
            stats.finished = time.perf_counter()  # the last commit; stopping Ray's processes is not the job's time
    finally:
        runner.close()
        ledger.remove_uncommitted(ledger.commits())  # attempts that lost a race or were cut off


@contextmanager
def _running(cfg: JobConfig, stats: RunStats, stop: threading.Event, out_dir: Path) -> Iterator[Progress]:
    """Progress display and signal handling around a run; ``Interrupted`` once stopped."""
    with Progress(stats, cfg.execution.progress, cfg.execution.log_interval_s) as progress, _signals(stop):
        yield progress
    if stop.is_set():
        raise Interrupted(f"{out_dir}: interrupted; committed rows are kept, rerun the same command to resume")


def _quality_gate(
    cfg: JobConfig, adapter: Any, model: Any, shards: list[Shard], ledger: Ledger
) -> dict[str, Any] | None:
    """Run the quality gate for a lowered precision (once per output directory and floor)."""
    rt = cfg.runtime
    if rt.precision == "fp32":
        return None
    cached = ledger.private / "quality.json"
    if cached.is_file():
        figures: dict[str, Any] = json.loads(cached.read_text())
        if figures.get("floor") == rt.quality_floor and figures.get("passed"):
            return figures
    reference = build_adapter(cfg.model_copy(update={"runtime": rt.model_copy(update={"precision": "fp32"})}), model)
    sample = sample_rows(shards, list(adapter.input_columns), rt.quality_sample_rows)
    figures = quality_gate(
        adapter,
        reference,
        sample,
        batch_size=rt.rows_per_call,
        floor=rt.quality_floor,
        precision=rt.precision,
        threads=rt.threads or available_cpus(),
    )
    ledger.write_private("quality.json", figures)
    return figures


def _write_report(
    cfg: JobConfig, ledger: Ledger, stats: RunStats, status: str, fingerprint: str, kind: str, engine: str
) -> dict[str, Any]:
    report = {
        "status": status,
        "job_fingerprint": fingerprint,
        "model_kind": kind,
        "engine": engine,
        "precision": cfg.runtime.precision,
        "batch_size": cfg.runtime.batch_size,
        "max_tokens": cfg.runtime.max_tokens,
        "threads": cfg.runtime.threads or available_cpus(),
        **stats.to_json(price_per_hour=cfg.cost.instance_price_per_hour, currency=cfg.cost.currency),
    }
    try:
        ledger.write_private("report.json", report)
        write_prometheus(ledger.private / "metrics.prom", report, {"job": fingerprint[:12]})
    except (OSError, OutputError) as exc:  # the report must never hide the run's own outcome
        log.warning("could not write the report: %s", exc)
    return report


def _write_success(ledger: Ledger, fingerprint: str, input_errors: int) -> None:
    commits = sorted(ledger.commits(), key=lambda c: (c.shard, c.start))
    ledger.write_success(
        {
            "job_fingerprint": fingerprint,
            "completed": time.time(),
            "rows": sum(c.rows for c in commits),
            "rows_failed": failed_rows(commits),
            "inputs_failed": input_errors,
            "error_files": [f"_errors/{name}" for name in active_error_files(commits)]
            + (["_errors/inputs.jsonl"] if input_errors else []),
            "files": [
                {
                    "name": c.file,
                    "rows": c.rows,
                    "bytes": c.bytes,
                    "sha256": c.sha256,
                    "shard": c.shard,
                    "start": c.start,
                    "stop": c.stop,
                }
                for c in commits
                if c.file
            ],
        }
    )
