"""The Ray cluster as bulkinfer uses it: join it (or start a local instance), check that a
worker fits on a node, take the driver's view in a worker process, and decide
``runtime.precision = "auto"`` on a worker when the driver lacks the job's device.

Only this package imports ray.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

from ...adapters import resolve_model
from ...config import ExecutionConfig, JobConfig
from ...core.errors import BulkinferError, ClusterError, ConfigError
from ...precision.settle import on_a_worker
from ...precision.tune import auto_precision
from ..worker import enter

__all__ = ["auto_on_cluster", "capacity", "connect", "disconnect", "ray_module", "workers_that_fit"]

log = logging.getLogger("bulkinfer")


def ray_module() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "execution.backend = 'ray' needs Ray: pip install 'bulkinfer[ray]' (or 'ray[default]')"
        ) from exc
    return ray


_CONNECTED_HERE = False
"""Whether this process's connection to Ray was made by bulkinfer (and is closed by it): a
calibration before the job and the job's runner share one connection."""


def connect(ex: ExecutionConfig) -> None:
    """Join ``execution.ray_address`` or start a local instance, unless connected already
    (ray.init installs its own SIGTERM handler: the job installs its own again afterwards)."""
    global _CONNECTED_HERE
    ray = ray_module()
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
        ray_module().shutdown()
        _CONNECTED_HERE = False


def capacity(ex: ExecutionConfig) -> tuple[int, str]:
    """How many workers the alive nodes' total CPUs and GPUs fit, and the largest node."""
    nodes = [n["Resources"] for n in ray_module().nodes() if n.get("Alive")]
    need = {"CPU": ex.num_cpus, "GPU": ex.num_gpus}
    fit = 0
    for res in nodes:
        fit += int(min(res.get(k, 0.0) // v for k, v in need.items() if v > 0))
    largest = max((r.get("CPU", 0.0) for r in nodes), default=0.0)
    gpus = max((r.get("GPU", 0.0) for r in nodes), default=0.0)
    return fit, f"largest node: {largest:g} CPUs, {gpus:g} GPUs"


def workers_that_fit(ex: ExecutionConfig) -> int:
    """:func:`capacity`'s count; a one-line error when no node fits one worker (a task or an
    actor asking for more would wait for ever)."""
    fit, largest = capacity(ex)
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
        cfg = enter(cfg_json, cwd, paths)
        return (*auto_precision(cfg, resolve_model(cfg)), socket.gethostname())
    except BulkinferError as exc:
        return exc


def auto_on_cluster(cfg: JobConfig) -> tuple[str, str, str]:
    """``(engine, precision, why)`` for ``runtime.precision = auto`` when this driver lacks the
    job's device: a task with a worker's resources reads the tune results of its machine kind,
    or calibrates there once (kept in that node's cache)."""
    ray = ray_module()
    ex = cfg.execution
    connect(ex)  # kept for the job's runner; left again if the job stops here
    try:
        workers_that_fit(ex)
        log.info(
            "runtime.precision = auto: runtime.device = %s and this driver has no GPU; it is resolved on a worker",
            cfg.runtime.device,
        )
        there = on_a_worker(cfg)
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
