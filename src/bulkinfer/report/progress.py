"""The progress display: a rich bar on a terminal, a log line every few seconds otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from .stats import RunStats

__all__ = ["Progress"]

log = logging.getLogger("bulkinfer")


class Progress:
    """A rich bar on a terminal, a log line every ``interval`` seconds otherwise."""

    def __init__(self, stats: RunStats, mode: str = "auto", interval: float = 10.0) -> None:
        self.stats = stats
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "log"
        self.mode = mode
        self.interval = interval
        self._last_log = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]bulkinfer"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rows · {task.fields[rate]} rows/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[batches]}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.start()
            todo = self.stats.rows_planned
            self._task = self._bar.add_task(
                "run", total=todo, completed=self.stats.rows_already_done, rate="-", batches=""
            )
        return self

    def update(self) -> None:
        s = self.stats
        done = s.rows_already_done + max(s.rows_inferred, s.rows_out + s.rows_failed)
        rate = max(s.rows_inferred, s.rows_out) / max(s.run_s, 1e-9)
        remote = s.remote_line()  # a remote Batch API's batches by status
        if self._bar is not None:
            self._bar.update(
                self._task, completed=done, rate=f"{rate:,.0f}", batches=f"batches: {remote}" if remote else ""
            )
        elif self.mode == "log" and time.perf_counter() - self._last_log >= self.interval:
            self._last_log = time.perf_counter()
            left = s.rows_planned - done
            eta = f"{left / rate:.0f}" if rate > 0 else "unknown"  # nothing done yet: no rate to divide by
            by_status = ",".join(f"{k}:{v}" for k, v in sorted(s.remote_batches.items()))
            extra = f" batches={by_status}" if by_status else ""
            log.info("progress rows=%d/%d rows_per_s=%.1f eta_s=%s%s", done, s.rows_planned, rate, eta, extra)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self.update()
            self._bar.stop()
