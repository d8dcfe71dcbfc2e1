"""The Spark runner: the same job as local or Ray, with shards run as Spark tasks and committed
by the driver alone.

::

    driver (this process)                        Spark task (a Python worker, reused)
      plan, ledger lock, shards in flight  ────▶  Worker: adapter set up once per job,
      one Spark job per shard, up to the          LocalRunner over the shard, part and errors
      task slots at a time                        staged under .tmp-<attempt> names
      rename + ledger line  ◀── staged files ──

Each shard is a one-task Spark job submitted from a driver thread, so finished shards are
committed as they come (a job of many tasks would return nothing until its last task).
Spark retries a failed task (``spark.task.maxFailures``; a local master's ``local[N,F]``):
a retry stages under its own attempt's names, only the attempt Spark returns is renamed into
place, and the others' temporary files are swept when the run ends. A ``BulkinferError`` in a
task (a bad config, a model that does not load) is not retried: the driver raises it. On stop
(SIGTERM) no new shard is submitted; those running get ``_STOP_GRACE_S`` to finish and be
committed, the rest are cancelled and run again on resume. The driver keeps no state the ledger
does not, so rerunning the command after the driver dies resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from ..adapters import Adapter, job_setup_context
from ..config import JobConfig
from ..core import hardware
from ..core.errors import BulkinferError, ConfigError, ModelError
from ..core.threads import pool
from ..precision.gate import GateVerdict
from ..precision.settle import after_gate, for_workers
from ..report import RunStats
from ..sources import Shard
from ..spark.session import spark_session
from .contract import Committing, Gate, publish_results
from .grouping import Grouper, ShardQueue
from .worker import Worker

__all__ = ["SparkRunner", "run_task", "warm_task"]

log = logging.getLogger("bulkinfer")

_STOP_GRACE_S = 30.0

_WORKER: dict[str, Worker] = {}
"""This Python worker's set-up model, by job (a reused worker keeps it from task to task)."""


def run_task(payload: dict[str, Any]) -> dict[str, Any]:
    """One group of shards in a Spark task (one shard, or several when they are fast): the job's
    worker (set up on the first task this process gets), the shards through it. A
    ``BulkinferError`` is answered, not raised (retrying cannot help), with the shards finished
    before it."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else 0
    try:
        worker = _job_worker(payload["cfg"], payload["cwd"], payload["paths"])
        tag = f"{payload['tag']}-{ctx.taskAttemptId() if ctx is not None else os.getpid()}"
        answer = worker.process(payload["shards"], payload["name_starts"], tag, payload["stamp"])
    except BulkinferError as exc:
        return {"results": [], "error": exc, "attempt": attempt, "seconds": 0.0}
    return {**answer, "attempt": attempt}


def warm_task(payload: dict[str, Any]) -> Any:
    """Set the job's model up in this Python worker before any shard (the run's clock starts after)."""
    try:
        _job_worker(payload["cfg"], payload["cwd"], payload["paths"])
    except BulkinferError as exc:
        return exc
    return os.getpid()


def _job_worker(cfg_json: dict[str, Any], cwd: str, paths: list[str]) -> Worker:
    key = hashlib.sha256(json.dumps([cfg_json, cwd], sort_keys=True, default=str).encode()).hexdigest()
    worker = _WORKER.get(key)
    if worker is None:
        for old in _WORKER.values():  # another job's model: this worker serves one job at a time
            old.close()
        _WORKER.clear()
        worker = _WORKER[key] = Worker(cfg_json, cwd, paths)
    if worker.error is not None:
        raise worker.error
    return worker


class SparkRunner:
    """Runs shards as Spark tasks; ``commit.publish`` commits each staged result."""

    def __init__(self, cfg: JobConfig, adapter: Adapter, stats: RunStats, stop: threading.Event) -> None:
        ex = cfg.execution
        explicit = ex.model_fields_set
        if ex.ray_address or ex.num_gpus:
            raise ConfigError(
                "execution.ray_address and num_gpus are the Ray backend's; with backend = 'spark' give GPUs "
                "through execution.spark_conf (spark.task.resource.gpu.amount)"
            )
        if ex.num_cpus != int(ex.num_cpus):
            raise ConfigError(f"execution.num_cpus = {ex.num_cpus:g}: Spark tasks take whole CPUs (spark.task.cpus)")
        self.task_cpus = int(ex.num_cpus) if "num_cpus" in explicit else None
        self.cfg = cfg  # the tasks' view: the output's absolute path (settle.for_workers, by the job)
        self.adapter = adapter
        self.stats = stats
        self.stop = stop
        self.on_progress: Callable[[], None] = lambda: None
        self.session: Any = None
        self.started_here = False
        self.group = f"bulkinfer-{uuid.uuid4().hex[:12]}"
        self.counts = {"tasks": 0, "shards": 0, "task_retries": 0, "cancelled": 0}
        self.slots = 0
        self.grouper = Grouper()

    def start(self, gate: Gate) -> GateVerdict:
        """The quality gate (a lowered precision only) with this process's model, then the session."""
        verdict = GateVerdict()
        if self.cfg.runtime.precision != "fp32":
            if not hardware.device_here(self.cfg.runtime.device):
                raise ConfigError(
                    f"runtime.precision = {self.cfg.runtime.precision}: the quality gate runs on the Spark driver, "
                    f"which has no {self.cfg.runtime.device}; run the driver where the device is, or use fp32"
                )
            self.adapter.setup(job_setup_context(self.cfg))
            try:
                verdict = gate()
            finally:
                self.adapter.close()
            self.cfg = after_gate(self.cfg, verdict.figures)  # every task builds the model the gate chose
        ex = self.cfg.execution
        self.session, self.started_here = spark_session(ex.spark_master, ex.spark_conf, self.task_cpus)
        sc = self.session.sparkContext
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        if self.task_cpus is not None and cpus != self.task_cpus:
            raise ConfigError(
                f"execution.num_cpus = {self.task_cpus}, but the running Spark session gives each task {cpus} "
                "(spark.task.cpus); drop num_cpus or match them"
            )
        # a task's model runs as many intra-op threads as its task has CPUs
        self.cfg = for_workers(self.cfg, self.cfg.sink.path, cpus)
        self.slots = max(1, min(ex.workers or sc.defaultParallelism // cpus or 1, sc.defaultParallelism))
        return verdict

    def close(self) -> None:
        master = self.session.sparkContext.master if self.session is not None else None
        self.stats.backend = {"name": "spark", "master": master, "slots": self.slots, **self.counts}
        if self.session is not None and self.started_here:
            self.session.stop()
        self.session = None

    def run(self, shards: Sequence[Shard], commit: Committing, rows: frozenset[int] | None = None) -> None:
        """Run ``shards`` to completion (or until ``stop``); each result is committed once."""
        if rows is not None:
            raise ConfigError("--retry-errors runs with the local backend; drop --backend spark")
        sc = self.session.sparkContext
        log.info("spark: %d task slot(s) × %g CPU on %s", self.slots, self.cfg.execution.num_cpus, sc.master)
        common = {
            "cfg": self.cfg.model_dump(mode="json"),
            "cwd": os.getcwd(),
            "paths": [os.getcwd(), *sys.path],
            "stamp": commit.stamp,
        }
        self._warm(common)
        todo = ShardQueue(shards)
        running: dict[Future[dict[str, Any]], _Task] = {}
        self.stats.mark_running()
        with pool(self.slots, "bulkinfer-spark") as tasks:
            try:
                while todo or running:
                    if self.stop.is_set():
                        self._wind_down(running, commit)
                        return
                    while todo and len(running) < self.slots:
                        size = self.grouper.size(len(todo), self.slots)
                        group = [todo.popleft() for _ in range(min(size, len(todo)))]
                        payload = {**common, "shards": group, "name_starts": [commit.name_start(x) for x in group]}
                        running[tasks.submit(self._job, payload)] = _Task(group)
                    done, _ = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                    for future in done:
                        self._accept(commit, running.pop(future), future)
            except BaseException:
                sc.cancelJobGroup(self.group)
                raise

    def _warm(self, common: dict[str, Any]) -> None:
        """One task per slot sets the model up in its Python worker (reused by the shards' tasks), so
        the run's rows/s, like the Ray backend's, starts with the workers ready."""
        sc = self.session.sparkContext
        sc.setJobGroup(self.group, "bulkinfer: set the model up", interruptOnCancel=True)
        try:
            got = sc.parallelize([common] * self.slots, self.slots).map(warm_task).collect()
        except Exception as exc:
            raise ModelError(f"model set-up failed on Spark: {_cause(exc)}") from None
        for answer in got:
            if isinstance(answer, BaseException):
                raise answer
        log.info("spark: the model is set up in %d Python worker(s)", len(set(got)))

    def _job(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One group of shards as a one-task Spark job (from a driver thread: jobs run side by side)."""
        sc = self.session.sparkContext
        first, n = payload["shards"][0], len(payload["shards"])
        what = f"bulkinfer shard {first.index}" + (f" and {n - 1} more" if n > 1 else "")
        sc.setJobGroup(self.group, what, interruptOnCancel=True)
        payload["tag"] = uuid.uuid4().hex[:12]
        result: dict[str, Any] = sc.parallelize([payload], 1).map(run_task).collect()[0]
        return result

    def _accept(self, commit: Committing, task: _Task, future: Future[dict[str, Any]]) -> None:
        """Commit a task's shards (together when the job allows); then raise what stopped it, if anything."""
        try:
            answer = future.result()
        except Exception as exc:
            shard = task.shards[0]
            rows = f"rows {shard.start}..{shard.stop}" + (
                f" (and {len(task.shards) - 1} more shards)" if len(task.shards) > 1 else ""
            )
            raise ModelError(f"{shard.uri}: {rows} failed on Spark{_retries(self)}: {_cause(exc)}") from None
        results = answer["results"]
        self.counts["tasks"] += 1
        self.counts["shards"] += len(results)
        self.counts["task_retries"] += answer["attempt"]
        publish_results(commit, results, self.stats)
        if answer["error"] is not None:
            raise answer["error"]
        self.grouper.observe(answer["seconds"], len(task.shards))

    def _wind_down(self, running: dict[Future[dict[str, Any]], _Task], commit: Committing) -> None:
        """On stop: the shards running get a grace period to finish and be committed; the rest are
        cancelled (their rows run again on resume)."""
        deadline = time.monotonic() + _STOP_GRACE_S
        while running and time.monotonic() < deadline:
            done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                task = running.pop(future)
                try:
                    self._accept(commit, task, future)
                except ModelError as exc:
                    log.warning("%s", exc)
        if running:
            cancelled = sum(len(task.shards) for task in running.values())
            self.counts["cancelled"] += cancelled
            log.warning("stop: %d running shard(s) cancelled; they run again on resume", cancelled)
            self.session.sparkContext.cancelJobGroup(self.group)


@dataclass(eq=False)
class _Task:
    """A group of shards handed to one Spark task."""

    shards: list[Shard]


def _retries(runner: SparkRunner) -> str:
    conf = runner.session.sparkContext.getConf()
    master = runner.session.sparkContext.master
    if master.startswith("local") and "," not in master:
        return " (a local master retries no task: use local[N,F] for F attempts)"
    return f" after {conf.get('spark.task.maxFailures', '4')} attempt(s)"


def _cause(exc: BaseException) -> str:
    """The Python error a failed task ended with (the last line of its traceback), else the
    first line of what Spark says."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            block = []
            for x in lines[i + 1 :]:
                if x.startswith(("at ", "Driver stacktrace", "Caused by")):
                    break
                block.append(x)
            if block:
                return block[-1][:300]
    if "Python worker exited unexpectedly" in text or "crashed" in text:
        return "a Python worker exited unexpectedly (crashed or killed)"
    return (lines[0] if lines else type(exc).__name__)[:300]
