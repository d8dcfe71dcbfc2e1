"""What a run did, read from its events (never deciding anything): counters (``stats``),
the progress display (``progress``), ``report.json``, ``metrics.prom`` and prices (``publish``),
column statistics and drift (``columns``, ``drift``), lineage events (``lineage``)."""

from __future__ import annotations

from .progress import Progress
from .publish import prometheus_text, write_report
from .stats import RunStats

__all__ = ["Progress", "RunStats", "prometheus_text", "write_report"]
