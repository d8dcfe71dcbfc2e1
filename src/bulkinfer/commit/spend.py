"""``execution.max_cost``: after every commit, the run's cost is projected from the instance's
price, the time so far and the rate rows are going at; once the projection passes the limit
the job stops as on SIGTERM (what is in flight commits) and exits 1 with the figures. A rerun
resumes from the commits, with the same or a raised limit."""

from __future__ import annotations

import threading

from ..config import JobConfig
from ..core.errors import ConfigError
from ..report import RunStats

__all__ = ["CostGuard"]


class CostGuard:
    """Stops the run (``stop``) once its projected cost passes ``execution.max_cost``."""

    def __init__(self, cfg: JobConfig, stats: RunStats, stop: threading.Event) -> None:
        from ..report.publish import instance_price

        self.limit = cfg.execution.max_cost
        self.price, _source = instance_price(cfg)
        self.currency = cfg.cost.currency
        if self.limit is not None and not self.price:
            raise ConfigError(
                "execution.max_cost: the run's cost needs a price: set cost.instance or cost.instance_price_per_hour"
            )
        self.stats, self.stop = stats, stop
        self.tripped: str | None = None

    def check(self) -> None:
        s = self.stats
        if self.limit is None or self.tripped is not None or s.rows_in == 0:
            return
        remaining = max(0, s.rows_planned - s.rows_already_done - s.rows_in)
        rate = s.rows_in / max(s.run_s, 1e-9)
        spent = self.price * s.wall_s / 3600
        projected = self.price * (s.wall_s + remaining / rate) / 3600
        if projected <= self.limit:
            return
        c = self.currency
        self.tripped = (
            f"stopped: the run's projected cost {projected:.4f} {c} is over execution.max_cost = {self.limit} {c} "
            f"({spent:.4f} {c} spent on {s.rows_in} of {s.rows_in + remaining} rows at {rate:.1f} rows/s, "
            f"{self.price} {c}/hour); committed rows are kept: raise max_cost and rerun to resume"
        )
        self.stop.set()
