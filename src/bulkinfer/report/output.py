"""What a finished (or stopped) run leaves behind besides its results: ``report.json`` and a
Prometheus text file in ``_bulkinfer/``. The report never hides the run's own outcome."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..adapters import available_cpus
from ..errors import OutputError
from .columns import OutputStats, describe
from .stats import RunStats

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..ledger import Commit, OutputLedger

__all__ = ["STATS", "load_output_stats", "prometheus_text", "write_report"]

STATS = "stats.json"

log = logging.getLogger("bulkinfer")


def write_report(
    cfg: JobConfig, ledger: OutputLedger, stats: RunStats, status: str, fingerprint: str, kind: str, engine: str
) -> dict[str, Any]:
    """Write ``report.json`` and ``metrics.prom``; return the report (also when writing failed)."""
    report = {
        "status": status,
        "job_fingerprint": fingerprint,
        "model_kind": kind,
        "engine": engine,
        "precision": cfg.runtime.precision,
        "batch_size": cfg.runtime.batch_size,
        "max_tokens": cfg.runtime.max_tokens,
        "threads": cfg.runtime.threads or available_cpus(),
        **stats.to_json(price_per_hour=cfg.cost.instance_price_per_hour, currency=cfg.cost.currency),
    }
    try:
        ledger.write_private(STATS, stats.output.to_json())
        ledger.write_private("report.json", report)
        ledger.write_private_text("metrics.prom", prometheus_text(report, {"job": fingerprint[:12]}))
    except (OSError, OutputError) as exc:  # the report must never hide the run's own outcome
        log.warning("could not write the report: %s", exc)
    return report


def load_output_stats(ledger: OutputLedger, commits: list[Commit], fmt: str, skip: list[str]) -> OutputStats:
    """The statistics of the committed parts: those ``stats.json`` kept, plus those of parts
    committed after it was last written (a run killed outright), computed again from the files."""
    from ..sinks.files import deserialize

    saved = ledger.read_private(STATS)
    kept = OutputStats.from_json(saved) if saved and saved.get("version") == 1 else OutputStats()
    in_force = {c.file for c in commits if c.file}
    out = OutputStats()
    if kept.covers <= in_force:  # else it describes another job's parts (--overwrite): start again
        out = kept
    missing = sorted(in_force - out.covers)
    if missing:
        log.info("computing the statistics of %d part(s) committed after the last stats.json", len(missing))
    for name in missing:
        out.add(name, describe(deserialize(ledger.read_part(name), fmt), skip))
    return out


def prometheus_text(report: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """The run's figures in Prometheus text format (for node_exporter's textfile collector)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    names = list(labels)
    values = [labels[k] for k in names]

    def gauge(name: str, doc: str, value: float | None, extra: Mapping[str, str] | None = None) -> None:
        if value is None:
            return
        keys = names + list(extra or {})
        g = Gauge(name, doc, keys, registry=reg) if name not in gauges else gauges[name]
        gauges[name] = g
        g.labels(*values, *(extra or {}).values()).set(value)

    gauges: dict[str, Gauge] = {}
    gauge("bulkinfer_rows_out", "Rows written by this run.", report["rows_out"])
    gauge("bulkinfer_rows_failed", "Rows failed in this run.", report["rows_failed"])
    gauge("bulkinfer_wall_seconds", "Wall time of this run.", report["wall_s"])
    gauge("bulkinfer_rows_per_second", "Throughput of this run.", report["rows_per_s"])
    for stage, secs in report["time_s"].items():
        gauge("bulkinfer_stage_seconds", "Busy seconds per pipeline stage.", secs, {"stage": stage})
    gauge("bulkinfer_cost_per_million_rows", "Cost per million rows.", report["cost"]["per_million_rows"])
    return generate_latest(reg).decode()
