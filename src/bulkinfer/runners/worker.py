"""A worker process of a cluster backend (a Ray actor, a Spark task's Python worker): it takes
the driver's view, sets the job's adapter up once, then runs the shards the driver hands it
through the local runner, staging each part under a temporary name for the driver to commit.
Nothing here imports a cluster framework."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import pyarrow as pa

from ..adapters import job_setup_context
from ..adapters.custom import add_import_paths
from ..commit.committer import PartStamp, stage_routed
from ..commit.routing import compile_routes
from ..config import JobConfig
from ..core.errors import BulkinferError
from ..core.records import redact
from ..core.storage import use_storage_options
from ..precision.gate import gate_figures
from ..precision.settle import settle
from ..report import RunStats
from ..sinks import StagedOutput, make_sink
from ..sources import Shard
from .local import LocalRunner
from .reuse import WindowReuse
from .window import Assembler

__all__ = ["Worker", "enter"]


def enter(cfg_json: dict[str, Any], cwd: str, paths: list[str]) -> JobConfig:
    """A worker process takes the driver's view: its working directory (relative input paths and
    custom modules resolve as there), its import paths and storage options; the job's config."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    add_import_paths(paths)
    cfg = JobConfig.model_validate(cfg_json)
    use_storage_options(cfg.source.storage_options, cfg.source.paths)  # this process reads too
    return cfg


class Worker:
    """Sets the adapter up once, then runs shards handed to it by the driver (a Ray actor wraps
    it; a Spark task's Python worker keeps one per job)."""

    def __init__(self, cfg_json: dict[str, Any], cwd: str, paths: list[str]) -> None:
        self.cfg = enter(cfg_json, cwd, paths)
        redact(self.cfg.execution.redact)  # a worker's error records withhold values as the driver's do
        self.sink = make_sink(self.cfg)
        self.routes = compile_routes(self.cfg)
        self.runner: Any = None
        self.error: BaseException | None = None
        threads = max(1, int(self.cfg.execution.num_cpus))
        try:
            settled = settle(self.cfg)  # the driver's config is settled already: the same model and adapter
            self.model, self.adapter = settled.model, settled.adapter
            self.adapter.setup(job_setup_context(self.cfg, threads=threads))
            # one per worker, shared by its shards: the previous output's index is loaded once and
            # the dedupe cache and output types carry from shard to shard
            self.reuse = WindowReuse(self.cfg, self.adapter.input_columns)
            self.assembler = Assembler(self.cfg.sink.preserve_order, self.cfg.source.id_column)
        except BaseException as exc:  # reported by ready(), raised by the driver
            self.error = exc

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "error": self.error}

    def gate(self, shards: list[Shard]) -> Any:
        """The quality gate with this worker's model (its node has the job's device, which the
        driver may lack): the figures, or the error the driver raises."""
        if self.error is not None:
            return self.error
        try:
            return gate_figures(self.cfg, self.adapter, self.model, shards)
        except BulkinferError as exc:
            return exc

    def process(self, shard: Shard, name_start: int | None, tag: str, stamp: PartStamp) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        stats = RunStats()
        runner = LocalRunner(self.cfg, self.adapter, stats, threading.Event())
        runner.reuse, runner.assembler = self.reuse, self.assembler
        self.reuse.load_previous()
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

    def close(self) -> None:
        """Release the model (a process that outlives the job, as a Spark Python worker does)."""
        if self.error is None:
            self.adapter.close()
