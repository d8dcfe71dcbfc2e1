"""The Ray runner: the same job on Ray actors, committed by the driver alone.

::

    driver (this process)                         worker actor × N (set up once)
      plan, ledger lock, queue of shards  ──────▶  LocalRunner over one shard
      heartbeat, straggler splits                  (read ▸ tokenize ▸ infer ▸ serialise)
      rename + ledger line  ◀─ staged files ────  part and errors under .tmp-<attempt> names

Workers pull one shard at a time, so a slow worker takes fewer. A worker writes its
shard's part under a temporary name on the shared output and reports it; only the
driver renames it into place and appends the ledger line, so the exactly-once guarantee
is the local one. When a worker or its node dies, its shard goes back on the queue; when
a worker is presumed dead (no heartbeat for ``execution.worker_timeout_s``) and comes
back, the first attempt of a row range to finish is committed and any later one is
deleted. An idle worker takes the second half of the remaining rows of a running shard
(``execution.split_min_rows``). The driver keeps no state that the ledger does not:
after the driver dies, rerunning the command resumes.

Only this module imports ray.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from ..adapters import Adapter, job_setup_context
from ..commit.committer import PartStamp, stage_routed
from ..commit.routing import compile_routes
from ..config import ExecutionConfig, JobConfig
from ..core.errors import BulkinferError, ClusterError, ConfigError, ModelError
from ..core.storage import use_storage_options
from ..precision.settle import after_gate
from ..report import RunStats
from ..sinks import StagedOutput, make_sink
from ..sources import Shard
from .base import Committing, Gate

__all__ = ["RayRunner", "auto_on_cluster", "connect", "disconnect"]

log = logging.getLogger("bulkinfer")

_HEARTBEAT_S = 1.0
_STOP_GRACE_S = 30.0


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "execution.backend = 'ray' needs Ray: pip install 'bulkinfer[ray]' (or 'ray[default]')"
        ) from exc
    return ray


def _enter(cfg_json: dict[str, Any], cwd: str, paths: list[str]) -> JobConfig:
    """A worker process takes the driver's view: its working directory (relative input paths and
    custom modules resolve as there), its import paths and storage options; the job's config."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    for p in reversed(paths):
        if p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)
    cfg = JobConfig.model_validate(cfg_json)
    use_storage_options(cfg.source.storage_options, cfg.source.paths)  # this process reads too
    return cfg


_CONNECTED_HERE = False
"""Whether this process's connection to Ray was made by bulkinfer (and is closed by it): a
calibration before the job and the job's runner share one connection."""


def connect(ex: ExecutionConfig) -> None:
    """Join ``execution.ray_address`` or start a local instance, unless connected already
    (ray.init installs its own SIGTERM handler: the job installs its own again afterwards)."""
    global _CONNECTED_HERE
    ray = _ray()
    if ray.is_initialized():
        return
    _reachable(ex.ray_address)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if ex.ray_address:
            ray.init(address=ex.ray_address, **kwargs)
        else:  # our own instance (address="local": even when another Ray runs on this machine);
            # workers do the job's work, so they need not yield to anything
            ray.init(address="local", **kwargs, _system_config={"worker_niceness": 0})
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = ex.ray_address or "a local Ray instance"
        raise ConfigError(f"execution.ray_address: cannot connect to {where} ({exc})") from exc
    _CONNECTED_HERE = True


def disconnect() -> None:
    """Leave (and for a local instance, stop) Ray if :func:`connect` joined it."""
    global _CONNECTED_HERE
    if _CONNECTED_HERE:
        _ray().shutdown()
        _CONNECTED_HERE = False


def _capacity(ex: ExecutionConfig) -> tuple[int, str]:
    """How many workers the alive nodes' total CPUs and GPUs fit, and the largest node."""
    nodes = [n["Resources"] for n in _ray().nodes() if n.get("Alive")]
    need = {"CPU": ex.num_cpus, "GPU": ex.num_gpus}
    fit = 0
    for res in nodes:
        fit += int(min(res.get(k, 0.0) // v for k, v in need.items() if v > 0))
    largest = max((r.get("CPU", 0.0) for r in nodes), default=0.0)
    gpus = max((r.get("GPU", 0.0) for r in nodes), default=0.0)
    return fit, f"largest node: {largest:g} CPUs, {gpus:g} GPUs"


def _fit(ex: ExecutionConfig) -> int:
    """:func:`_capacity`'s count; a one-line error when no node fits one worker (a task or an
    actor asking for more would wait for ever)."""
    fit, largest = _capacity(ex)
    if fit == 0:
        raise ConfigError(
            f"execution.num_cpus={ex.num_cpus:g}, num_gpus={ex.num_gpus:g}: no node of the Ray cluster "
            f"fits one worker ({largest}); lower them"
        )
    return fit


def _auto_on_worker(cfg_json: dict[str, Any], cwd: str, paths: list[str]) -> Any:
    """``runtime.precision = auto`` resolved in a worker process, which has the job's device:
    ``(engine, precision, why, host)``, or the error the driver raises."""
    try:
        cfg = _enter(cfg_json, cwd, paths)
        from ..adapters import resolve_model
        from ..precision.tune import auto_precision

        return (*auto_precision(cfg, resolve_model(cfg)), socket.gethostname())
    except BulkinferError as exc:
        return exc


def auto_on_cluster(cfg: JobConfig) -> tuple[str, str, str]:
    """``(engine, precision, why)`` for ``runtime.precision = auto`` when this driver lacks the
    job's device: a task with a worker's resources reads the tune results of its machine kind,
    or calibrates there once (kept in that node's cache)."""
    ray = _ray()
    ex = cfg.execution
    connect(ex)  # kept for the job's runner; left again if the job stops here
    try:
        _fit(ex)
        log.info(
            "runtime.precision = auto: runtime.device = %s and this driver has no GPU; it is resolved on a worker",
            cfg.runtime.device,
        )
        there = cfg.model_copy(update={"execution": ex.model_copy(update={"backend": "local"})})
        task = ray.remote(_auto_on_worker).options(num_cpus=ex.num_cpus, num_gpus=ex.num_gpus, max_retries=0)
        try:
            got = ray.get(task.remote(there.model_dump(mode="json"), os.getcwd(), [os.getcwd(), *sys.path]))
        except ray.exceptions.RayError as exc:
            raise ClusterError(f"runtime.precision = auto on a worker failed ({type(exc).__name__}: {exc})") from exc
        if isinstance(got, BaseException):
            raise got
    except BaseException:
        disconnect()
        raise
    engine, precision, why, host = got
    return engine, precision, f"{why}; on a worker, {host}"


class Worker:
    """A Ray actor: sets the adapter up once, then runs shards handed to it by the driver."""

    def __init__(self, cfg_json: dict[str, Any], cwd: str, paths: list[str]) -> None:
        from ..adapters import build_adapter, resolve_model

        self.cfg = _enter(cfg_json, cwd, paths)
        from ..core.records import redact

        redact(self.cfg.execution.redact)  # a worker's error records withhold values as the driver's do
        self.sink = make_sink(self.cfg)
        self.routes = compile_routes(self.cfg)
        self.runner: Any = None
        self.error: BaseException | None = None
        from .reuse import DedupeCache

        self.previous: Any = None  # the previous output's index (--incremental-from), loaded on first use
        self.cache = DedupeCache(self.cfg.runtime.dedupe_cache_rows)
        threads = max(1, int(self.cfg.execution.num_cpus))
        try:
            self.model = resolve_model(self.cfg)
            self.adapter = build_adapter(self.cfg, self.model)
            self.adapter.setup(job_setup_context(self.cfg, threads=threads))
        except BaseException as exc:  # reported by ready(), raised by the driver
            self.error = exc

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "error": self.error}

    def gate(self, shards: list[Shard]) -> Any:
        """The quality gate with this worker's model (its node has the job's device, which the
        driver may lack): the figures, or the error the driver raises."""
        from ..precision.gate import gate_figures

        if self.error is not None:
            return self.error
        try:
            return gate_figures(self.cfg, self.adapter, self.model, shards)
        except BulkinferError as exc:
            return exc

    def process(self, shard: Shard, name_start: int | None, tag: str, stamp: PartStamp) -> dict[str, Any]:
        from .local import LocalRunner

        if self.error is not None:
            raise self.error
        stats = RunStats()
        runner = LocalRunner(self.cfg, self.adapter, stats, threading.Event())
        runner.previous, runner.cache = self.previous, self.cache  # built once per worker, shared by its shards
        runner.load_previous()
        self.previous = runner.previous
        done: list[tuple[StagedOutput, pa.Table, dict[str, pa.Table]]] = []
        self.runner = runner
        try:
            runner.run(
                [shard],
                lambda out: done.append(stage_routed(self.sink, self.routes, out, name_start, tag, stamp=stamp)),
            )
        finally:
            self.runner = None
        staged, table, routed = done[0]
        table = table if self.cfg.export else None  # export and route targets are written by the driver
        return {"staged": staged, "table": table, "routed": routed, "figures": stats.worker_figures()}

    def progress(self) -> dict[int, int]:
        runner = self.runner
        return runner.progress() if runner is not None else {}

    def split(self, index: int, at: int, stop: int) -> int | None:
        runner = self.runner
        return runner.split(index, at, stop) if runner is not None else None


@dataclass(eq=False)
class _Slot:
    """One worker actor and what the driver knows of it."""

    actor: Any
    name: str
    ready: Any  # the ready() reference while starting, then None
    attempt: _Attempt | None = None
    suspect: bool = False  # presumed dead: no new work until it answers again
    probe: Any = None
    probe_sent: float = 0.0
    last_seen: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Attempt:
    shard: Shard  # the rows this attempt still owns (a split moves ``stop``)
    slot: _Slot
    ref: Any
    next_read: int
    abandoned: bool = False  # re-queued after its worker was presumed dead


class RayRunner:
    """Runs shards on Ray actors; ``commit.publish`` commits each staged result."""

    def __init__(self, cfg: JobConfig, adapter: Adapter, stats: RunStats, stop: threading.Event) -> None:
        # workers write to the same output, whatever their working directory
        sink = make_sink(cfg)
        out = sink.out_dir if isinstance(sink.out_dir, str) else str(sink.out_dir.resolve())
        self.cfg = cfg.model_copy(update={"sink": cfg.sink.model_copy(update={"path": out})})
        self.adapter = adapter
        self.on_progress: Callable[[], None] = lambda: None
        self.ex = cfg.execution
        self.stats = stats
        self.stop = stop
        self.ray = _ray()
        self.slots: list[_Slot] = []
        self.todo: deque[Shard] = deque()
        self.attempts: dict[Any, _Attempt] = {}
        self.covered: dict[int, list[tuple[int, int]]] = {}
        self.rows_left = 0
        self.counts = {"splits": 0, "requeued": 0, "discarded": 0, "workers_lost": 0, "workers_started": 0}
        self._n = 0
        self._actor_class: Any = None
        self.target = 0
        self._stranded_since: float | None = None

    # -- the runner contract -----------------------------------------------------------
    def start(self, gate: Gate) -> None:
        """Run the quality gate (only a lowered precision has one) before any worker starts:
        here, or on a worker started for it when this driver lacks the job's device (a GPU
        job's driver on a CPU head node); then join the cluster."""
        if self.cfg.runtime.precision != "fp32":
            if self._device_here():
                self.adapter.setup(job_setup_context(self.cfg))
                try:
                    gate()
                finally:
                    self.adapter.close()
            else:
                self.connect()
                _fit(self.ex)
                log.info(
                    "quality gate: runtime.device = %s and this driver has no GPU; the gate runs on a worker",
                    self.cfg.runtime.device,
                )
                gate(self._gate_on_cluster)
            self.cfg = after_gate(self.cfg, self.stats.quality)  # every worker builds the model the gate chose
        self.connect()

    def _device_here(self) -> bool:
        """Whether this process can run the job's device (a GPU job's driver often has none)."""
        from ..core import hardware

        return hardware.device_here(self.cfg.runtime.device)

    def _gate_on_cluster(self, cfg: JobConfig, adapter: Adapter, model: Any, shards: list[Shard]) -> dict[str, Any]:
        """The gate's figures from a worker started for it (with the workers' CPUs and GPUs)."""
        actor = self._actor()
        try:
            result = self.ray.get(actor.gate.remote(list(shards)))
        except self.ray.exceptions.RayError as exc:
            raise ClusterError(f"the quality gate on a worker failed ({type(exc).__name__}: {exc})") from exc
        finally:
            self.ray.kill(actor, no_restart=True)
        if isinstance(result, BaseException):
            raise result
        # the worker's own log line stays on its node (log_to_driver is off)
        shown = ", ".join(f"{k}={v}" for k, v in result.items() if isinstance(v, (int, float, bool)))
        log.info("quality gate (on a worker, %s vs fp32): %s", result.get("precision"), shown)
        return dict(result)

    # -- cluster ---------------------------------------------------------------------
    def connect(self) -> None:
        """Join the configured cluster or start a local instance (:func:`connect`)."""
        connect(self.ex)

    def close(self) -> None:
        """Stop the workers, and the Ray instance if this process started it."""
        self.stats.backend = {"name": "ray", "workers": self.target, **self.counts}
        for slot in self.slots:
            self.ray.kill(slot.actor, no_restart=True)
        self.slots = []
        disconnect()

    def _size(self) -> int:
        """How many workers to start: never more than the cluster's CPUs and GPUs fit."""
        fit = _fit(self.ex)
        if self.ex.workers and self.ex.workers > fit:
            log.warning("execution.workers=%d but the Ray cluster fits %d; starting %d", self.ex.workers, fit, fit)
        return min(self.ex.workers or fit, fit)

    def _actor(self) -> Any:
        """A worker actor with the job's config, the workers' resources, this working directory."""
        if self._actor_class is None:
            self._actor_class = self.ray.remote(Worker)
        remote = self._actor_class.options(
            num_cpus=self.ex.num_cpus,
            num_gpus=self.ex.num_gpus,
            max_concurrency=3,  # process() in one thread; progress() and split() answer beside it
            max_restarts=0,
            scheduling_strategy="SPREAD",
        )
        return remote.remote(self.cfg.model_dump(mode="json"), os.getcwd(), [os.getcwd(), *sys.path])

    def _start_worker(self) -> _Slot:
        self._n += 1
        actor = self._actor()
        self.counts["workers_started"] += 1
        return _Slot(actor, f"worker-{self._n}", actor.ready.remote())

    # -- main loop ---------------------------------------------------------------------
    def run(self, shards: Sequence[Shard], commit: Committing, rows: frozenset[int] | None = None) -> None:
        """Run ``shards`` to completion (or until ``stop``); each result is committed once.
        Call :meth:`start` first and :meth:`close` after."""
        if rows is not None:
            raise ConfigError("--retry-errors runs with the local backend; drop --backend ray")
        self.connect()
        n = self._size()
        nodes = sum(1 for x in self.ray.nodes() if x.get("Alive"))
        log.info("ray: %d worker(s) × %g CPU on %d node(s)", n, self.ex.num_cpus, nodes)
        self.slots = [self._start_worker() for _ in range(n)]
        self.target = n
        self.todo = deque(shards)
        self.rows_left = sum(s.num_rows for s in shards)
        while self.rows_left > 0:
            if self.stop.is_set():
                self._wind_down(commit)
                return
            self._check_started()
            self._assign(commit)
            self._collect(commit, timeout=0.2)
            self._heartbeat()
            self._split_stragglers()
            self._replace_lost()

    def _check_started(self) -> None:
        starting = [s for s in self.slots if s.ready is not None]
        if not starting:
            return
        done, _ = self.ray.wait([s.ready for s in starting], num_returns=len(starting), timeout=0)
        for slot in starting:
            if slot.ready not in done:
                continue
            try:
                info = self.ray.get(slot.ready)
            except self.ray.exceptions.RayError as exc:
                self._lost(slot, f"died while starting ({_short(exc)})")
                continue
            slot.ready = None
            if info["error"] is not None:
                err = info["error"]
                raise err if isinstance(err, BulkinferError) else ModelError(f"model set-up failed on a worker: {err}")
            slot.last_seen = time.monotonic()
            if self.stats.running_since is None:
                self.stats.mark_running()
            log.info("%s ready (pid %s on %s)", slot.name, info["pid"], info["host"])

    def _assign(self, commit: Committing) -> None:
        for slot in self.slots:
            if not self.todo:
                return
            if slot.ready is None and slot.attempt is None and not slot.suspect:
                shard = self.todo.popleft()
                if self._is_covered(shard):
                    continue
                tag = uuid.uuid4().hex[:12]  # names the attempt's temp files
                ref = slot.actor.process.remote(shard, commit.name_start(shard), tag, commit.stamp)
                attempt = _Attempt(shard, slot, ref, shard.start)
                slot.attempt = attempt
                slot.last_seen = time.monotonic()
                self.attempts[ref] = attempt

    def _collect(self, commit: Committing, timeout: float) -> None:
        refs = list(self.attempts)
        if not refs:
            time.sleep(timeout)
            return
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in done:
            attempt = self.attempts.pop(ref, None)
            if attempt is None:
                continue
            slot = attempt.slot
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BulkinferError):
                    raise cause from None
                where = f"{attempt.shard.uri}: a worker failed on rows {_rows(attempt.shard)}"
                raise ModelError(f"{where}: {cause or exc}") from None
            except self.ray.exceptions.RayError as exc:
                self._lost(slot, _short(exc))
                continue
            if slot.attempt is attempt:
                slot.attempt = None
            slot.suspect = False
            slot.last_seen = time.monotonic()
            self._accept(commit, result)

    def _accept(self, commit: Committing, result: dict[str, Any]) -> None:
        staged: StagedOutput = result["staged"]
        shard = staged.shard
        if self._is_covered(shard):
            commit.discard(staged)
            self.counts["discarded"] += 1
            log.info(
                "rows %s of shard %d were committed by another attempt; this one is discarded",
                _rows(shard),
                shard.index,
            )
            return
        commit.publish(staged, result["table"], result["routed"])
        self.covered.setdefault(shard.index, []).append((shard.start, shard.stop))
        self.rows_left -= shard.num_rows
        self.stats.merge(result["figures"])

    def _is_covered(self, shard: Shard) -> bool:
        """Whether any row of ``shard`` was already committed (by another attempt)."""
        return any(a < shard.stop and shard.start < b for a, b in self.covered.get(shard.index, []))

    # -- faults ------------------------------------------------------------------------
    def _requeue(self, attempt: _Attempt, why: str) -> None:
        if attempt.abandoned:
            return
        attempt.abandoned = True
        if not self._is_covered(attempt.shard):
            self.todo.appendleft(attempt.shard)
            self.counts["requeued"] += 1
            log.warning(
                "%s %s; rows %s of %s re-queued", attempt.slot.name, why, _rows(attempt.shard), attempt.shard.uri
            )

    def _lost(self, slot: _Slot, why: str) -> None:
        if slot not in self.slots:
            return
        self.slots.remove(slot)
        self.counts["workers_lost"] += 1
        if slot.attempt is not None:
            self._requeue(slot.attempt, f"died ({why})")
            self.attempts = {r: a for r, a in self.attempts.items() if a.slot is not slot}
        else:
            log.warning("%s died (%s)", slot.name, why)
        self.ray.kill(slot.actor, no_restart=True)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        for slot in list(self.slots):
            if slot.attempt is None and not slot.suspect:
                continue
            if slot.probe is not None:
                done, _ = self.ray.wait([slot.probe], timeout=0)
                if done:
                    try:
                        answer = self.ray.get(slot.probe)
                    except self.ray.exceptions.RayError as exc:
                        self._lost(slot, _short(exc))
                        continue
                    slot.probe = None
                    slot.last_seen = now
                    if slot.attempt is not None and slot.attempt.shard.index in answer:
                        slot.attempt.next_read = answer[slot.attempt.shard.index]
                elif now - slot.last_seen > self.ex.worker_timeout_s and not slot.suspect:
                    slot.suspect = True
                    if slot.attempt is not None:
                        self._requeue(slot.attempt, f"answered no heartbeat for {self.ex.worker_timeout_s:g} s")
            if slot.probe is None and now - slot.probe_sent >= _HEARTBEAT_S:
                slot.probe = slot.actor.progress.remote()
                slot.probe_sent = now

    def _replace_lost(self) -> None:
        if len(self.slots) < self.target and self._fits():
            self.slots.append(self._start_worker())
            return
        # No worker that has loaded the model is left, and no alive node could hold one (a
        # replacement asked for may wait forever): give an autoscaler worker_timeout_s to
        # add a node, then stop rather than hang. Committed shards are kept.
        working = [s for s in self.slots if s.ready is None and not s.suspect]
        if working or _capacity(self.ex)[0] > 0:
            self._stranded_since = None
            return
        now = time.monotonic()
        self._stranded_since = self._stranded_since or now
        if now - self._stranded_since > self.ex.worker_timeout_s:
            raise ClusterError(
                f"every Ray worker is gone and no node of the cluster fits a new one ({_capacity(self.ex)[1]}; waited "
                f"execution.worker_timeout_s={self.ex.worker_timeout_s:g} s for one to join); rerun when the cluster "
                "has room (committed shards are kept)"
            )

    def _fits(self) -> bool:
        free = self.ray.available_resources()
        return bool(
            free.get("CPU", 0.0) >= self.ex.num_cpus
            and (self.ex.num_gpus == 0 or free.get("GPU", 0.0) >= self.ex.num_gpus)
        )

    # -- stragglers and stopping ---------------------------------------------------------
    def _split_stragglers(self) -> None:
        if self.todo or self.ex.split_min_rows == 0:
            return
        idle = [s for s in self.slots if s.ready is None and s.attempt is None and not s.suspect]
        if not idle:
            return
        running = [a for a in self.attempts.values() if not a.abandoned and not a.slot.suspect]
        running.sort(key=lambda a: a.shard.stop - a.next_read, reverse=True)
        for attempt in running[: len(idle)]:
            left = attempt.shard.stop - attempt.next_read
            if left < 2 * self.ex.split_min_rows:
                return
            at = self._ask_split(attempt, attempt.next_read + left // 2)
            if at is not None:
                self.todo.append(replace(attempt.shard, start=at))
                log.info(
                    "straggler: rows %d..%d of shard %d go to an idle worker",
                    at,
                    attempt.shard.stop,
                    attempt.shard.index,
                )
                attempt.shard = replace(attempt.shard, stop=at)
                self.counts["splits"] += 1

    def _ask_split(self, attempt: _Attempt, at: int) -> int | None:
        s = attempt.shard
        try:
            accepted = self.ray.get(attempt.slot.actor.split.remote(s.index, at, s.stop), timeout=10)
        except self.ray.exceptions.RayError:
            return None  # the heartbeat deals with a worker that does not answer
        return None if accepted is None else int(accepted)

    def _wind_down(self, commit: Committing) -> None:
        """On stop: each running shard ends at the rows already read; commit those, then return."""
        for attempt in list(self.attempts.values()):
            if not attempt.abandoned:
                at = self._ask_split(attempt, attempt.next_read)
                if at is not None:
                    attempt.shard = replace(attempt.shard, stop=at)
        deadline = time.monotonic() + _STOP_GRACE_S
        while any(not a.abandoned for a in self.attempts.values()) and time.monotonic() < deadline:
            self._collect(commit, timeout=0.5)


def _reachable(address: str | None, timeout: float = 5.0) -> None:
    """Fail fast on a cluster address nothing answers at (Ray itself retries for minutes)."""
    if not address or address == "auto":
        return
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"execution.ray_address {address!r}: expected auto, ray://host:port or host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"execution.ray_address {address!r}: nothing answers there ({exc.strerror or exc}); "
            "start the cluster (ray start --head) or fix the address"
        ) from exc


def _rows(shard: Shard) -> str:
    return f"{shard.start}..{shard.stop}"


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
