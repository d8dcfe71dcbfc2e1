"""What a run reports and is accounted by: ``[cost]``, ``[lineage]``, ``[monitor]``, ``[metrics]``
and ``[index]``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .section import Section


class CostConfig(Section):
    instance_price_per_hour: float = Field(default=0.0, ge=0)
    """Price of the machine per hour, for cost per million rows in the report (0: from ``instance``)."""
    instance: str | None = None
    """A known instance type (c7i.large, g5.xlarge...): its on-demand price comes from bulkinfer's price table."""
    currency: str = "USD"
    """Currency of the price."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels the run's cost is booked under ({team = "search", model = "minilm-v2"}): in the report, the
    metrics and ``bulkinfer costs``."""


class LineageConfig(Section):
    url: str | None = None
    """An OpenLineage HTTP endpoint (Marquez: http://host:5000): START, COMPLETE, FAIL and ABORT run events."""
    endpoint: str = "api/v1/lineage"
    """The path events are POSTed to under ``url``."""
    file: str | None = None
    """Append the events to this file, one JSON object per line (beside or instead of ``url``)."""
    namespace: str = "bulkinfer"
    """The OpenLineage job namespace."""
    job_name: str | None = None
    """The OpenLineage job name (default: the output folder's name)."""
    timeout_s: float = Field(default=5.0, gt=0)
    """Seconds to wait for the receiver; a receiver that is down costs a warning, never the run."""


class MonitorConfig(Section):
    baseline: str | None = None
    """An earlier run's output: this run's column statistics are compared with its stats.json (drift)."""
    max_psi: float = Field(default=0.25, ge=0)
    """A column whose population stability index against the baseline is over this has drifted."""
    fail_on_drift: bool = False
    """Exit 1 after committing when a column drifted (the output is kept; the pipeline stops)."""


class MetricsConfig(Section):
    port: int | None = Field(default=None, ge=0, le=65535)
    """Serve the run's metrics at http://0.0.0.0:PORT/metrics while it runs (a Prometheus scrape; --metrics-port)."""
    pushgateway: str | None = None
    """A Prometheus Pushgateway (http://host:9091): the metrics pushed every push_interval_s and once at the end."""
    push_interval_s: float = Field(default=15.0, gt=0)
    """Seconds between pushes to the Pushgateway."""
    deadline: str | None = None
    """When the job must be done (ISO 8601, 2026-12-08T06:00:00Z): a metric an alert compares the ETA with."""
    instance: str | None = None
    """The ``instance`` grouping label of the pushed metrics (default: this host's name)."""

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str | None) -> str | None:
        if v is not None:
            deadline_timestamp(v)
        return v


def deadline_timestamp(text: str) -> float:
    """``metrics.deadline`` as a Unix time; one without a zone is UTC."""
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: expected an ISO 8601 time such as 2026-12-08T06:00:00Z") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


class IndexConfig(Section):
    output: str | None = None
    """Build a nearest-neighbour index here once the job completes (None: no index; see bulkinfer index)."""
    column: str = "embedding"
    """The vector column to index."""
    kind: Literal["flat", "hnsw", "ivf-pq"] = "hnsw"
    """flat (exact), hnsw, or ivf-pq (compressed)."""
    metric: Literal["cosine", "ip", "l2"] = "cosine"
    """Similarity of the index and of the recall check."""
    min_recall: float | None = Field(default=None, ge=0, le=1)
    """Refuse an index whose recall@10 against exact search is lower (the job fails; its output stays)."""
