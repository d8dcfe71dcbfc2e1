"""The driver's side of a Ray job: a queue of shards handed to worker actors (one call at a
time each, of one shard or, when shards are fast, several: :mod:`..grouping`), heartbeats,
straggler splits, replacement of lost workers, and the commit of each staged part by this
process alone (see the package's docstring)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...adapters import Adapter, job_setup_context
from ...config import JobConfig
from ...core.errors import BulkinferError, ClusterError, ConfigError, ModelError
from ...precision.gate import GateVerdict, sample_shards
from ...precision.settle import after_gate
from ...report import RunStats
from ...sinks import StagedOutput
from ...sources import Shard
from ..contract import Committing, Gate, publish_results
from ..grouping import Grouper, ShardQueue
from ..worker import Worker
from .cluster import capacity, connect, disconnect, ray_module, workers_that_fit

__all__ = ["RayRunner"]

log = logging.getLogger("bulkinfer")

_HEARTBEAT_S = 1.0
_STOP_GRACE_S = 30.0


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
    shards: list[Shard]  # the rows this attempt still owns (a split moves the last one's ``stop``)
    slot: _Slot
    ref: Any
    next_read: int  # of a one-shard attempt (only those are split)
    sent: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # re-queued after its worker was presumed dead

    @property
    def shard(self) -> Shard:
        """The shard being worked on when the attempt has one (the last, of a group)."""
        return self.shards[-1]


class RayRunner:
    """Runs shards on Ray actors; ``commit.publish`` commits each staged result."""

    def __init__(self, cfg: JobConfig, adapter: Adapter, stats: RunStats, stop: threading.Event) -> None:
        self.cfg = cfg  # the workers' view: the output's absolute path (settle.for_workers, by the job)
        self.adapter = adapter
        self.on_progress: Callable[[], None] = lambda: None
        self.ex = cfg.execution
        self.stats = stats
        self.stop = stop
        self.ray = ray_module()
        self.slots: list[_Slot] = []
        self.todo = ShardQueue()
        self.attempts: dict[Any, _Attempt] = {}
        self.driver_cpu_s = 0.0
        self.covered: dict[int, list[tuple[int, int]]] = {}
        self.grouper = Grouper()
        self.rows_left = 0
        self.counts = {"splits": 0, "requeued": 0, "discarded": 0, "workers_lost": 0, "workers_started": 0, "calls": 0}
        self._n = 0
        self._actor_class: Any = None
        self.target = 0
        self._stranded_since: float | None = None
        # where a run's time goes (report.json backend): joining the cluster, the workers' start
        # (process, imports, model set-up), and how busy they were once started
        self._t0 = 0.0
        self.timing: dict[str, float] = {}
        self.worker_busy_s = 0.0

    # -- the runner contract -----------------------------------------------------------
    def start(self, gate: Gate) -> GateVerdict:
        """Run the quality gate (only a lowered precision has one) before any worker starts:
        here, or on a worker started for it when this driver lacks the job's device (a GPU
        job's driver on a CPU head node); then join the cluster."""
        verdict = GateVerdict()
        if self.cfg.runtime.precision != "fp32":
            if self._device_here():
                self.adapter.setup(job_setup_context(self.cfg))
                try:
                    verdict = gate()
                finally:
                    self.adapter.close()
            else:
                self.connect()
                workers_that_fit(self.ex)
                log.info(
                    "quality gate: runtime.device = %s and this driver has no GPU; the gate runs on a worker",
                    self.cfg.runtime.device,
                )
                verdict = gate(self._gate_on_cluster)
            self.cfg = after_gate(self.cfg, verdict.figures)  # every worker builds the model the gate chose
        self.connect()
        return verdict

    def _device_here(self) -> bool:
        """Whether this process can run the job's device (a GPU job's driver often has none)."""
        from ...core import hardware

        return hardware.device_here(self.cfg.runtime.device)

    def _gate_on_cluster(self, cfg: JobConfig, adapter: Adapter, model: Any, shards: Sequence[Shard]) -> dict[str, Any]:
        """The gate's figures from a worker started for it (with the workers' CPUs and GPUs),
        sent the shards its sample reads."""
        actor = self._actor()
        try:
            result = self.ray.get(actor.gate.remote(sample_shards(shards)))
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
        """Join the configured cluster or start a local instance (:func:`connect`); the first
        call's seconds are the run's ``connect_s``."""
        t0 = time.perf_counter()
        connect(self.ex)
        self.timing.setdefault("connect_s", time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the workers, and the Ray instance if this process started it."""
        cpu = {"driver_cpu_s": round(self.driver_cpu_s, 3)} if self.driver_cpu_s else {}
        self.stats.backend = {"name": "ray", "workers": self.target, **self.counts, **cpu, **self._times()}
        for slot in self.slots:
            self.ray.kill(slot.actor, no_restart=True)
        self.slots = []
        disconnect()

    def _times(self) -> dict[str, float]:
        """``connect_s``; ``workers_ready_s``: from the driver having joined (after the gate) until
        the last worker was ready; ``worker_busy_share``: the workers' own seconds on shards over
        their time since the first was ready."""
        out = {k: round(v, 3) for k, v in self.timing.items() if k in ("connect_s", "workers_ready_s")}
        first, end = self.timing.get("first_ready_s"), self.timing.get("end_s")
        if first is not None and end is not None and end > first and self.target:
            out["worker_busy_share"] = round(min(1.0, self.worker_busy_s / (self.target * (end - first))), 3)
        return out

    def _size(self) -> int:
        """How many workers to start: never more than the cluster's CPUs and GPUs fit."""
        fit = workers_that_fit(self.ex)
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
        self._t0 = time.perf_counter()
        self.connect()
        n = self._size()
        nodes = sum(1 for x in self.ray.nodes() if x.get("Alive"))
        log.info("ray: %d worker(s) × %g CPU on %d node(s)", n, self.ex.num_cpus, nodes)
        self.slots = [self._start_worker() for _ in range(n)]
        self.target = n
        self.todo = ShardQueue(shards)
        self.rows_left = sum(s.num_rows for s in shards)
        cpu = time.process_time()  # the driver's own cost, all its threads (Ray's among them): what it could sustain
        try:
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
        finally:
            self.driver_cpu_s = time.process_time() - cpu
            self.timing["end_s"] = time.perf_counter() - self._t0

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
            since = time.perf_counter() - self._t0
            self.timing.setdefault("first_ready_s", since)
            self.timing["workers_ready_s"] = since
            if self.stats.running_since is None:
                self.stats.mark_running()
            log.info("%s ready (pid %s on %s)", slot.name, info["pid"], info["host"])

    def _assign(self, commit: Committing) -> None:
        for slot in self.slots:
            if slot.ready is not None or slot.attempt is not None or slot.suspect:
                continue
            group: list[Shard] = []
            size = self.grouper.size(len(self.todo), len(self.slots))
            while self.todo and len(group) < size:
                shard = self.todo.popleft()
                if not self._is_covered(shard):
                    group.append(shard)
            if not group:
                return
            tag = uuid.uuid4().hex[:12]  # names the attempt's temp files
            starts = [commit.name_start(s) for s in group]
            ref = slot.actor.process.remote(group, starts, tag, commit.stamp)
            attempt = _Attempt(group, slot, ref, group[-1].start)
            slot.attempt = attempt
            slot.last_seen = attempt.sent
            self.attempts[ref] = attempt
            self.counts["calls"] += 1

    def _collect(self, commit: Committing, timeout: float) -> None:
        refs = list(self.attempts)
        if not refs:
            time.sleep(timeout)
            return
        done, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)  # on as soon as one is back
        if done:
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)  # and every other one back by now
        results: list[dict[str, Any]] = []
        failure: BulkinferError | None = None
        for ref in done:
            attempt = self.attempts.pop(ref, None)
            if attempt is None:
                continue
            slot = attempt.slot
            try:
                answer = self.ray.get(ref)
            except self.ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                where = f"{attempt.shard.uri}: a worker failed on rows {_rows(attempt.shard)}"
                failure = cause if isinstance(cause, BulkinferError) else ModelError(f"{where}: {cause or exc}")
                break
            except self.ray.exceptions.RayError as exc:
                self._lost(slot, _short(exc))
                continue
            if slot.attempt is attempt:
                slot.attempt = None
            now = time.monotonic()
            slot.suspect = False
            slot.last_seen = now
            results.extend(answer["results"])
            if answer["error"] is not None:
                failure = answer["error"]
                break
            self.grouper.observe(answer["seconds"], len(attempt.shards))
            self.worker_busy_s += answer["seconds"]
        self._accept(commit, results)  # what came back whole before a failure is committed all the same
        if failure is not None:
            raise failure from None
        self._assign(commit)  # the freed workers start their next shards before anything else

    def _accept(self, commit: Committing, results: list[dict[str, Any]]) -> None:
        """Commit what came back, together when the job allows (one ledger append for all);
        an attempt whose rows another attempt committed is discarded."""
        fresh: list[dict[str, Any]] = []
        for result in results:
            staged: StagedOutput = result["staged"]
            shard = staged.shard
            if self._is_covered(shard) or any(_overlap(shard, r["staged"].shard) for r in fresh):
                commit.discard(staged)
                self.counts["discarded"] += 1
                log.info(
                    "rows %s of shard %d were committed by another attempt; this one is discarded",
                    _rows(shard),
                    shard.index,
                )
                continue
            fresh.append(result)
        publish_results(commit, fresh, self.stats)
        for r in fresh:
            shard = r["staged"].shard
            self.covered.setdefault(shard.index, []).append((shard.start, shard.stop))
            self.rows_left -= shard.num_rows

    def _is_covered(self, shard: Shard) -> bool:
        """Whether any row of ``shard`` was already committed (by another attempt)."""
        return any(a < shard.stop and shard.start < b for a, b in self.covered.get(shard.index, []))

    # -- faults ------------------------------------------------------------------------
    def _requeue(self, attempt: _Attempt, why: str) -> None:
        if attempt.abandoned:
            return
        attempt.abandoned = True
        back = [s for s in attempt.shards if not self._is_covered(s)]
        self.todo.extendleft(back)  # first in the queue, in their order
        self.counts["requeued"] += len(back)
        if len(back) == 1:
            log.warning("%s %s; rows %s of %s re-queued", attempt.slot.name, why, _rows(back[0]), back[0].uri)
        elif back:
            log.warning("%s %s; its %d shards re-queued (%s ...)", attempt.slot.name, why, len(back), back[0].uri)

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
                    if (
                        slot.attempt is not None
                        and len(slot.attempt.shards) == 1
                        and slot.attempt.shard.index in answer
                    ):
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
        if working or capacity(self.ex)[0] > 0:
            self._stranded_since = None
            return
        now = time.monotonic()
        self._stranded_since = self._stranded_since or now
        if now - self._stranded_since > self.ex.worker_timeout_s:
            raise ClusterError(
                f"every Ray worker is gone and no node of the cluster fits a new one ({capacity(self.ex)[1]}; waited "
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
        running = [a for a in self.attempts.values() if len(a.shards) == 1 and not a.abandoned and not a.slot.suspect]
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
                attempt.shards = [replace(attempt.shard, stop=at)]
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
            if not attempt.abandoned and len(attempt.shards) == 1:  # a group of fast shards runs to its end
                at = self._ask_split(attempt, attempt.next_read)
                if at is not None:
                    attempt.shards = [replace(attempt.shard, stop=at)]
        deadline = time.monotonic() + _STOP_GRACE_S
        while any(not a.abandoned for a in self.attempts.values()) and time.monotonic() < deadline:
            self._collect(commit, timeout=0.5)


def _overlap(a: Shard, b: Shard) -> bool:
    return a.index == b.index and a.start < b.stop and b.start < a.stop


def _rows(shard: Shard) -> str:
    return f"{shard.start}..{shard.stop}"


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
