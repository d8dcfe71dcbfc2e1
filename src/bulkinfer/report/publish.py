"""What a finished (or stopped) run leaves behind besides its results: ``report.json`` and a
Prometheus text file in ``_bulkinfer/``. The report never hides the run's own outcome."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import ConfigError, OutputError
from ..core.hardware import available_cpus, cpu, gpu, isa_key
from ..core.layout import STATS
from .columns import OutputStats, describe
from .stats import RunStats

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = [
    "PrivateFiles",
    "instance_price",
    "load_output_stats",
    "price_table",
    "prometheus_text",
    "run_entry",
    "write_report",
]

log = logging.getLogger("bulkinfer")


class PrivateFiles(Protocol):
    """What the report needs of an output's ledger (:mod:`bulkinfer.commit`, a stage above this
    one): its private files and its committed parts."""

    def write_private(self, name: str, data: Mapping[str, Any]) -> None: ...
    def write_private_text(self, name: str, text: str) -> None: ...
    def read_private(self, name: str) -> dict[str, Any] | None: ...
    def read_part(self, name: str) -> bytes: ...


def write_report(
    cfg: JobConfig,
    ledger: PrivateFiles,
    stats: RunStats,
    status: str,
    fingerprint: str,
    kind: str,
    engine: str,
    output_bytes: int = 0,
    started_at: float | None = None,
    runs_on: str | None = None,
) -> dict[str, Any]:
    """Write ``report.json``, ``metrics.prom``, ``stats.json`` and this run's entry in ``runs/``
    (what ``bulkinfer costs`` adds up); return the report (also when writing failed). ``runs_on``:
    the engine and its provider or device as set up in this process (None when the model was not
    set up here: a Ray run's workers hold it)."""
    started_at = time.time() - stats.wall_s if started_at is None else started_at
    price, price_source = instance_price(cfg)
    report = {
        "status": status,
        "job_fingerprint": fingerprint,
        "model_kind": kind,
        "engine": engine,
        "runs_on": runs_on,
        "precision": cfg.runtime.precision,
        "batch_size": cfg.runtime.batch_size,
        "max_tokens": cfg.runtime.max_tokens,
        "threads": cfg.runtime.threads or available_cpus(),
        "machine": {**cpu(), "isa": isa_key(), "gpu": gpu(cfg.runtime.device)},
        **stats.to_json(price_per_hour=price, currency=cfg.cost.currency, token_prices=_token_prices(cfg)),
        "process": process_use(),
        "output_rows": stats.output.rows,  # every committed part's rows, earlier runs' too
        "output_files": len(stats.output.covers),
        "output_bytes": output_bytes,
    }
    report["cost"].update({"instance": cfg.cost.instance, "price_source": price_source, "labels": cfg.cost.labels})
    report["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at))
    previous = _previous_report(ledger, fingerprint)
    report["job"] = _job_totals(previous, report)
    if previous is not None and not (stats.rows_out or stats.rows_failed or stats.shards_committed):
        report = _kept(previous, report)  # a run that did nothing does not replace the last run's figures
    try:
        ledger.write_private(STATS, stats.output.to_json())
        ledger.write_private("report.json", report)
        labels = {"job": fingerprint[:12], **{_label_name(k): v for k, v in cfg.cost.labels.items()}}
        ledger.write_private_text("metrics.prom", prometheus_text(report, labels))
        ledger.write_private(
            f"runs/{_stamp(started_at)}-{uuid.uuid4().hex[:8]}.json",
            run_entry(report, fingerprint),
        )
    except (OSError, OutputError) as exc:  # the report must never hide the run's own outcome
        log.warning("could not write the report: %s", exc)
    return report


def process_use() -> dict[str, float]:
    """This process's CPU seconds (user and system) and its largest resident memory so far."""
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": round(use.ru_utime + use.ru_stime, 3), "max_rss_bytes": use.ru_maxrss * 1024}


def _previous_report(ledger: PrivateFiles, fingerprint: str) -> dict[str, Any] | None:
    """The report an earlier run of this job left (None: none, unreadable, or another job's)."""
    try:
        previous = ledger.read_private("report.json")
    except (OSError, OutputError, ValueError):
        return None
    return previous if previous and previous.get("job_fingerprint") == fingerprint else None


_TOTALS = ("rows_out", "rows_failed", "wall_s")


def _job_totals(previous: Mapping[str, Any] | None, report: Mapping[str, Any]) -> dict[str, Any]:
    """The job's figures over every run so far (an older report without them counts as one run)."""
    before = dict((previous or {}).get("job") or {})
    if previous is not None and not before:
        before = {"runs": 1, **{k: previous.get(k, 0) for k in _TOTALS}, "cost": previous["cost"].get("run", 0.0)}
    totals = {"runs": before.get("runs", 0) + 1}
    totals.update({k: round(before.get(k, 0) + report[k], 3) for k in _TOTALS})
    totals["cost"] = round(before.get("cost", 0.0) + report["cost"]["run"], 6)
    return totals


def _kept(previous: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """The last run's report, with the job's totals and the run that found nothing left to do."""
    latest = {k: report[k] for k in ("status", "started_at", "wall_s", "rows_out", "rows_already_done", "engine",
                                     "precision")}  # fmt: skip
    return {**previous, "job": report["job"], "latest_run": {**latest, "did_nothing": True}}


def _stamp(at: float) -> str:
    """A run's start to the microsecond, so that ``runs/`` lists in the order the runs began
    (a stopped run and its resume often start within the same second)."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(at))}.{int(at % 1 * 1_000_000):06d}"


def _label_name(key: str) -> str:
    """A cost label as a Prometheus label name."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return name if re.match(r"[a-zA-Z_]", name) and name != "job" else f"label_{name}"


def run_entry(report: Mapping[str, Any], fingerprint: str) -> dict[str, Any]:
    """What ``bulkinfer costs`` needs of one run (every run, stopped or not, was paid for)."""
    cost = report["cost"]
    return {
        "started_at": report["started_at"],
        "status": report["status"],
        "job_fingerprint": fingerprint,
        "wall_s": report["wall_s"],
        "rows_out": report["rows_out"],
        "rows_failed": report["rows_failed"],
        # unrounded: they are summed; a remote model's tokens are spend too
        "cost": round(cost["instance_price_per_hour"] * report["wall_s"] / 3600 + cost.get("remote_tokens", 0.0), 9),
        "currency": cost["currency"],
        "price_per_hour": cost["instance_price_per_hour"],
        "instance": cost.get("instance"),
        "labels": cost.get("labels") or {},
    }


def instance_price(cfg: JobConfig) -> tuple[float, str]:
    """The price per hour: ``cost.instance_price_per_hour`` when set, else the price table's
    for ``cost.instance`` (bulkinfer/data/prices.toml), else 0."""
    cost = cfg.cost
    if cost.instance_price_per_hour or not cost.instance:
        return cost.instance_price_per_hour, "cost.instance_price_per_hour"
    table = price_table()
    for provider, prices in table.items():
        if isinstance(prices, dict) and cost.instance in prices:
            return float(prices[cost.instance]), f"price table ({provider} on-demand)"
    known = sorted(k for p in table.values() if isinstance(p, dict) for k in p)
    raise ConfigError(
        f"cost.instance: {cost.instance!r} is not in bulkinfer's price table ({', '.join(known)}); "
        "set cost.instance_price_per_hour instead"
    )


def price_table() -> dict[str, Any]:
    import tomllib
    from importlib.resources import files

    return tomllib.loads(files("bulkinfer").joinpath("data/prices.toml").read_text())


def load_output_stats(ledger: PrivateFiles, in_force: set[str], fmt: str, skip: list[str]) -> OutputStats:
    """The statistics of the committed parts (named in ``in_force``): those ``stats.json`` kept,
    plus those of parts committed after it was last written (a run killed outright), computed
    again from the files."""
    from ..sinks.files import deserialize

    saved = ledger.read_private(STATS)
    kept = OutputStats.from_json(saved) if saved and saved.get("version") == 1 else OutputStats()
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


def _token_prices(cfg: JobConfig) -> tuple[float, float]:
    """A remote model's price per million input and output tokens (0, 0 for a local model)."""
    prices = cfg.model.price_per_million_tokens
    return float(prices.get("input", 0.0)), float(prices.get("output", 0.0))
