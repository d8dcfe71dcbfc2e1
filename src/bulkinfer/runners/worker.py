"""A worker process of a cluster backend (a Ray actor, a Spark task's Python worker): it takes
the driver's view, sets the job's adapter up once, then runs the shards the driver hands it
through the local runner, staging each part under a temporary name for the driver to commit.
Nothing here imports a cluster framework."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from ..adapters import job_setup_context
from ..adapters.custom import add_import_paths
from ..commit.committer import PartStamp, stage_routed
from ..commit.routing import compile_routes
from ..config import JobConfig
from ..core.errors import BulkinferError, ModelError
from ..core.storage import use_storage_options
from ..precision.gate import gate_figures
from ..precision.settle import settle
from ..report import RunStats
from ..sinks import make_sink
from ..sources import Shard
from ..sources.shard import ShardOutput
from .contract import Splittable
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
        self.sink = make_sink(self.cfg)
        self.routes = compile_routes(self.cfg)
        self.runner: Splittable | None = None
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

    def process(self, shards: list[Shard], name_starts: list[int | None], tag: str, stamp: PartStamp) -> dict[str, Any]:
        """Run ``shards`` through one local runner (a call of several when shards are fast:
        :mod:`bulkinfer.runners.grouping`), each staged for the driver to commit as it finishes.
        Answers ``results`` (one per shard finished, in order; the last carries the call's
        figures), ``error``: what stopped the call, on the shard after the last result (what
        finished before it is answered all the same), and ``seconds``: the call's time here, its
        round trip left out (what the driver sizes the next calls by)."""
        if self.error is not None:
            raise self.error
        names = {(s.index, s.start): n for s, n in zip(shards, name_starts, strict=True)}
        stats = RunStats()
        runner = LocalRunner(self.cfg, self.adapter, stats, threading.Event())
        runner.reuse, runner.assembler = self.reuse, self.assembler
        self.reuse.load_previous()
        results: list[dict[str, Any]] = []
        export = bool(self.cfg.export) or self.cfg.sink.format == "zarr"  # the driver writes exports, arrays

        def staged(out: ShardOutput) -> None:
            name_start = names[(out.shard.index, out.shard.start)]
            part, table, routed = stage_routed(self.sink, self.routes, out, name_start, tag, stamp=stamp)
            results.append({"staged": part, "table": table if export else None, "routed": routed, "figures": None})

        error: BulkinferError | None = None
        t0 = time.perf_counter()
        self.runner = runner
        try:
            runner.run(shards, staged)
        except BulkinferError as exc:
            error = exc
        except Exception as exc:  # the adapter's own: named with the rows it failed on
            shard = shards[min(len(results), len(shards) - 1)]
            where = f"{shard.uri}: a worker failed on rows {shard.start}..{shard.stop}"
            error = ModelError(f"{where}: {type(exc).__name__}: {exc}")
        finally:
            self.runner = None
        if results:
            results[-1]["figures"] = stats.worker_figures()
        return {"results": results, "error": error, "seconds": time.perf_counter() - t0}

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
