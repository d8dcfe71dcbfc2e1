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

Only this package imports ray: ``cluster`` (joining, fitting, deciding on a worker) and
``driver`` (:class:`RayRunner`); the actor is :class:`bulkinfer.runners.worker.Worker`, shared with
the Spark backend.
"""

from __future__ import annotations

from ..worker import Worker
from .cluster import auto_on_cluster, connect, disconnect
from .driver import RayRunner

__all__ = ["RayRunner", "Worker", "auto_on_cluster", "connect", "disconnect"]
