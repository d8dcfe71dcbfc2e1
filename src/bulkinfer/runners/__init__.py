"""Where shards run, behind one contract (``contract``): ``local`` (this process, threads), ``ray``
(actors; only that package imports ray) and ``spark`` (tasks; with :mod:`bulkinfer.spark`, the
only importers of pyspark), the last two through the same ``worker``. :func:`make_runner` picks one."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .contract import BatchTimeout, Committing, Emit, Runner, ShardOutput
from .local import LocalRunner

if TYPE_CHECKING:
    from ..adapters import Adapter
    from ..config import JobConfig
    from ..report import RunStats

__all__ = ["BatchTimeout", "Committing", "Emit", "LocalRunner", "Runner", "ShardOutput", "make_runner"]


def make_runner(
    cfg: JobConfig, adapter: Adapter, stats: RunStats, stop: threading.Event, backend: str, ledger: Any = None
) -> Runner:
    """The runner of ``backend``; a remote-batch model's own (it records its batches in ``ledger``)."""
    if cfg.model.kind == "remote-batch":
        from ..adapters.remote_batch import RemoteRequests
        from .remote import RemoteBatchRunner

        assert isinstance(adapter, RemoteRequests) and ledger is not None
        return RemoteBatchRunner(cfg, adapter, stats, stop, ledger)
    if backend == "ray":
        from .ray import RayRunner

        return RayRunner(cfg, adapter, stats, stop)
    if backend == "spark":
        from .spark import SparkRunner

        return SparkRunner(cfg, adapter, stats, stop)
    return LocalRunner(cfg, adapter, stats, stop)
