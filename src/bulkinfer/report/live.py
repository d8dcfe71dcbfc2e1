"""The run's figures as Prometheus metrics while it runs: served at ``metrics.port``
(``--metrics-port``, a scrape) and pushed to ``metrics.pushgateway`` every ``push_interval_s``
and once at the end with the run's status (the way a CronJob or an Airflow task is watched).

The metrics are read from the run's :class:`~bulkinfer.report.RunStats` at each scrape or push
(no copy to keep in step); their names follow Prometheus' conventions and are listed in
docs/observability.md. Every series carries ``bulkinfer_job`` (the output folder's name, or
``lineage.job_name``) and the job's cost labels.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..config import JobConfig
from ..config.execution import error_budget
from ..config.operations import deadline_timestamp
from ..core.errors import ConfigError
from ..core.threads import thread
from .publish import process_use
from .stats import RunStats

__all__ = ["DOCS", "RunMetrics", "job_labels"]

log = logging.getLogger("bulkinfer")

EXIT_CODES = {"complete": 0, "failed": 1, "interrupted": 75}


def job_labels(cfg: JobConfig) -> dict[str, str]:
    """``bulkinfer_job`` and the cost labels (names made Prometheus-safe)."""
    import re

    name = cfg.lineage.job_name or os.path.basename(cfg.sink.path.rstrip("/")) or "bulkinfer"
    labels = {re.sub(r"\W", "_", k): str(v) for k, v in cfg.cost.labels.items()}
    return {"bulkinfer_job": name, **labels}


DOCS = {
    "bulkinfer_job_rows_planned": "Rows the job plans, over every run.",
    "bulkinfer_job_rows_done": "Rows committed (written or failed), earlier runs' too.",
    "bulkinfer_job_rows_failed": "Rows this run failed.",
    "bulkinfer_job_shards_planned": "Shards the job plans.",
    "bulkinfer_job_shards_done": "Shards committed, earlier runs' too.",
    "bulkinfer_job_rows_per_second": "Rows the model ran per second of this run.",
    "bulkinfer_job_eta_seconds": "Seconds left at this run's rate (absent before the first rows).",
    "bulkinfer_job_error_budget_used_ratio": "Failed rows over the error budget (1: spent).",
    "bulkinfer_job_stage_busy_ratio": "Share of the run a stage was busy (stages overlap).",
    "bulkinfer_job_memory_max_rss_bytes": "The run's largest resident memory (this process).",
    "bulkinfer_job_cpu_seconds": "CPU seconds this process used (user and system).",
    "bulkinfer_job_gate_passed": "1 when the quality gate passed, 0 when it failed (absent without a gate).",
    "bulkinfer_job_start_timestamp_seconds": "When the run started.",
    "bulkinfer_job_last_commit_timestamp_seconds": "When this run last committed a shard.",
    "bulkinfer_job_deadline_timestamp_seconds": "When the job must be done (metrics.deadline).",
    "bulkinfer_job_exit_code": "The run's exit status once it ended (0 done, 1 failed, 75 stopped).",
    "bulkinfer_job_end_timestamp_seconds": "When the run ended.",
}
"""Every metric a run exposes (docs/observability.md lists the same)."""

Figure = tuple[str, float, dict[str, str]]


class _Collector:
    """A prometheus_client collector over a run's stats (read when collected)."""

    def __init__(self, stats: RunStats, cfg: JobConfig, labels: Mapping[str, str]) -> None:
        self.stats, self.cfg, self.labels = stats, cfg, dict(labels)
        self.status: str | None = None  # set once the run ended
        self.ended: float | None = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, Any] = {}
        for name, value, extra in [*self._progress(), *self._health()]:
            family = families.get(name) or GaugeMetricFamily(name, DOCS[name], labels=[*self.labels, *extra])
            families[name] = family
            family.add_metric([*self.labels.values(), *extra.values()], value)
        yield from families.values()

    def _progress(self) -> Iterator[Figure]:
        s = self.stats
        done = s.rows_already_done + s.rows_out + s.rows_failed
        rate = s.rows_inferred / max(s.run_s, 1e-9) if s.running_since else 0.0
        yield "bulkinfer_job_rows_planned", s.rows_planned, {}
        yield "bulkinfer_job_rows_done", done, {}
        yield "bulkinfer_job_rows_failed", s.rows_failed, {}
        yield "bulkinfer_job_shards_planned", s.shards_planned, {}
        yield "bulkinfer_job_shards_done", s.shards_already_done + s.shards_committed, {}
        yield "bulkinfer_job_rows_per_second", rate, {}
        if rate > 0:
            yield "bulkinfer_job_eta_seconds", max(s.rows_planned - done, 0) / rate, {}
        budget = error_budget(self.cfg.execution, s.rows_planned)
        used = s.rows_failed / budget if budget else float(s.rows_failed > 0)
        yield "bulkinfer_job_error_budget_used_ratio", used, {}
        for stage, secs in s.stage_s.items():
            yield "bulkinfer_job_stage_busy_ratio", secs / max(s.run_s, 1e-9), {"stage": stage}

    def _health(self) -> Iterator[Figure]:
        s = self.stats
        use = process_use()
        yield "bulkinfer_job_memory_max_rss_bytes", use["max_rss_bytes"], {}
        yield "bulkinfer_job_cpu_seconds", use["cpu_s"], {}
        if s.quality is not None:
            yield "bulkinfer_job_gate_passed", float(bool(s.quality.get("passed"))), {}
        yield "bulkinfer_job_start_timestamp_seconds", time.time() - s.wall_s, {}
        if s.timeline:  # (seconds since the run started, rows) at each commit: the last one's wall time
            since = time.perf_counter() - s.started - s.timeline[-1][0]
            yield "bulkinfer_job_last_commit_timestamp_seconds", time.time() - since, {}
        if self.cfg.metrics.deadline:
            yield "bulkinfer_job_deadline_timestamp_seconds", deadline_timestamp(self.cfg.metrics.deadline), {}
        if self.status is not None and self.ended is not None:
            yield "bulkinfer_job_exit_code", float(EXIT_CODES.get(self.status, 1)), {}
            yield "bulkinfer_job_end_timestamp_seconds", self.ended, {}


class RunMetrics:
    """The run's metrics, exposed as ``metrics`` says (nothing when it says nothing)."""

    def __init__(self, cfg: JobConfig, stats: RunStats) -> None:
        from prometheus_client import CollectorRegistry

        self.cfg, self.m = cfg, cfg.metrics
        self.registry = CollectorRegistry()
        self.collector = _Collector(stats, cfg, job_labels(cfg))
        self.registry.register(self.collector)
        self._server: Any = None
        self._stop = threading.Event()
        self._pusher: threading.Thread | None = None

    def start(self) -> None:
        if self.m.port is not None:
            from prometheus_client import start_http_server

            try:
                self._server, _thread = start_http_server(self.m.port, registry=self.registry)
            except OSError as exc:
                raise ConfigError(f"metrics.port {self.m.port}: cannot listen ({exc.strerror or exc})") from None
            log.info("metrics at http://%s:%d/metrics", socket.gethostname(), self._server.server_port)
        if self.m.pushgateway:
            self._pusher = thread(self._push_every, name="bulkinfer-metrics-push")
            self._pusher.start()

    def finish(self, status: str) -> None:
        """The run ended: its status in the metrics, one last push, the scrape server closed."""
        self.collector.status, self.collector.ended = status, time.time()
        self._stop.set()
        if self._pusher is not None:
            self._pusher.join(timeout=10)
            self._push()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _push_every(self) -> None:
        while not self._stop.wait(self.m.push_interval_s):
            self._push()

    def _push(self) -> None:
        """A push to the Pushgateway (grouped by job and instance); one that fails is a warning."""
        from prometheus_client import push_to_gateway

        assert self.m.pushgateway
        grouping = {"instance": self.m.instance or socket.gethostname(), **self.collector.labels}
        try:
            push_to_gateway(self.m.pushgateway, job="bulkinfer", registry=self.registry, grouping_key=grouping,
                            timeout=5)  # fmt: skip
        except OSError as exc:
            log.warning("metrics.pushgateway: push to %s failed (%s)", self.m.pushgateway, exc)
