"""``[execution]``: how the job is driven (backend, resume, error budget, progress)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .section import Section


class ExecutionConfig(Section):
    backend: Literal["local", "ray", "spark"] = "local"
    """Where shards run: this process, Ray actors (a local Ray instance or an existing cluster), or
    Spark tasks (a local master or an existing cluster)."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``, ``host:6379``); None starts a local Ray instance."""
    spark_master: str | None = None
    """Spark master URL for backend = "spark" (``local[*]``, ``local[4,3]`` for 3 attempts per task,
    ``spark://host:7077``, ``yarn``, ``k8s://...``); None: the session this process already runs, else
    ``local[*]``."""
    spark_conf: dict[str, str] = Field(default_factory=dict)
    """Spark settings for the session a spark job starts (``spark.executor.memory``, ...)."""
    workers: int | None = Field(default=None, ge=1)
    """Ray workers (actors), or Spark shards in flight; None: as many as the cluster's CPUs fit at
    ``num_cpus`` each."""
    num_cpus: float = Field(default=1.0, gt=0)
    """CPUs each Ray worker (or Spark task: ``spark.task.cpus``, whole CPUs) reserves; its model runs
    that many intra-op threads."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs each Ray worker reserves (fractions share a GPU)."""
    worker_timeout_s: float = Field(default=60.0, gt=0)
    """A Ray worker that answers no heartbeat for this long is presumed dead; its shard is re-queued."""
    split_min_rows: int = Field(default=512, ge=0)
    """Straggler split: when a worker is idle, a running shard with at least twice this many rows left
    gives half of them to it; 0 turns splitting off."""
    overwrite: bool = False
    """Discard an output directory that holds a different job instead of refusing."""
    progress: Literal["auto", "bar", "log", "none"] = "auto"
    """Progress display: a bar on a terminal, periodic log lines otherwise."""
    log_interval_s: float = Field(default=10.0, gt=0)
    """Seconds between progress log lines when not on a terminal."""
    limit_rows: int | None = Field(default=None, ge=1)
    """Process only the first N planned rows (a smoke test of a big job)."""
    max_error_rate: float = Field(default=0.001, ge=0, le=1)
    """Stop (exit 1) once failed rows exceed this share of the planned rows."""
    repair: bool = False
    """Rebuild a corrupt ledger (commits.log) from the part and error files before running."""
    max_errors: int | None = Field(default=None, ge=0)
    """Stop (exit 1) once failed rows exceed this count; None: only max_error_rate applies."""
    max_cost: float | None = Field(default=None, ge=0)
    """Stop cleanly (commit what is in flight, exit 1) once the run's projected cost passes this, in
    cost.currency (needs cost.instance or cost.instance_price_per_hour); a rerun resumes."""
    redact: bool = False
    """Keep input values out of error records, logs and reports (row number, id, stage and error type
    stay); serve withholds them from its answers too."""
    min_error_budget: int = Field(default=10, ge=0)
    """Failed rows allowed whatever the rate, up to half the planned rows, so one bad row never fails a small
    job (max_error_rate = 0 allows none)."""


def error_budget(ex: ExecutionConfig, rows_planned: int) -> int:
    """Failed rows a job may have: ``max_error_rate`` of the planned rows, but at least
    ``min_error_budget`` (never more than half the rows, so a job failing wholesale still
    stops), capped by ``max_errors``; a rate of 0 allows none."""
    budget = int(ex.max_error_rate * rows_planned)
    if ex.max_error_rate > 0:
        budget = max(budget, min(ex.min_error_budget, rows_planned // 2))
    return budget if ex.max_errors is None else min(budget, ex.max_errors)
