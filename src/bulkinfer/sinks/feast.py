"""Feast export: each committed part's predictions pushed into the team's Feast online store
through a push source (``store.push(..., to=PushMode.ONLINE)``), keyed by the entity, so online
services read them as features: the precomputed-results pattern through their own store.

An online store keeps one value per entity and feature (the latest event time wins, an equal one
overwrites), so a part pushed again after a crash changes nothing: every entity once. The event
time is the entity row's own (a Feast-sourced job keeps ``source.timestamp_column``), else the
time the job was planned (the same on every resume).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..core.errors import ConfigError, OutputError
from ..core.faults import crash_point
from ..sources.feast import open_store
from .exports import id_setting

if TYPE_CHECKING:
    from ..config import FeastExport
    from ..plan import JobPlan

__all__ = ["FeastTarget"]


class FeastTarget:
    def __init__(self, spec: FeastExport, where: str) -> None:
        if not spec.push_source:
            raise ConfigError(f"{where}.push_source: name the push source the predictions go through")
        self.spec, self.where = spec, where
        self.name = f"{where} (feast push source {spec.push_source} in {spec.repo})"
        self.store: Any = None
        self.key = ""
        self.fields: list[str] = []
        self.time_field = "event_timestamp"
        self.row_time: str | None = None  # a kept column of event times, else the plan's
        self.planned = dt.datetime.now(dt.UTC)

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        self.store = open_store(self.spec.repo, f"{self.where}.repo")  # one line when Feast is not installed
        from feast.data_source import PushSource

        self.key = id_setting(plan, self.where)
        try:
            source = self.store.get_data_source(self.spec.push_source)
        except Exception:  # Feast's not-found errors differ between registries
            source = None
        if not isinstance(source, PushSource):
            pushes = sorted(s.name for s in self.store.list_data_sources() if isinstance(s, PushSource))
            raise ConfigError(f"{self.where}.push_source: the repo has no push source {self.spec.push_source!r} "
                              f"({', '.join(pushes) or 'none'})")  # fmt: skip
        views = [v for v in self.store.list_feature_views() if getattr(v.stream_source, "name", None) == source.name]
        if not views:
            raise ConfigError(f"{self.where}.push_source: no feature view reads {source.name!r}; feast apply one")
        if self.key not in views[0].join_keys:
            raise ConfigError(f"{self.where}: source.id_column {self.key!r} is not feature view {views[0].name!r}'s "
                              f"entity key ({', '.join(views[0].join_keys)})")  # fmt: skip
        self.fields = [f.name for f in views[0].features]
        batch = source.batch_source
        self.time_field = (batch.timestamp_field if batch is not None else "") or "event_timestamp"
        stamp = plan.config.get("source", {}).get("timestamp_column")
        self.row_time = stamp if plan.config.get("source", {}).get("kind") == "feast" and stamp in kept else None
        self.planned = dt.datetime.fromtimestamp(plan.created, dt.UTC)

    def write(self, part: str, table: pa.Table) -> None:
        from feast.data_source import PushMode

        if not table.num_rows:
            return
        missing = [f for f in self.fields if f not in table.column_names]
        if missing:
            raise OutputError(f"{self.name}: the feature view's field {missing[0]!r} is not an output column "
                              f"({', '.join(table.column_names)})")  # fmt: skip
        frame = table.select([self.key, *self.fields]).to_pandas()
        frame[self.time_field] = table.column(self.row_time).to_pandas() if self.row_time else self.planned
        try:
            self.store.push(self.spec.push_source, frame, to=PushMode.ONLINE)
        except (OSError, ValueError, RuntimeError) as exc:
            raise OutputError(f"{self.name}: pushing {part}: {' '.join(str(exc).split())[:300]}") from exc
        crash_point("export-feast-pushed")

    def complete(self) -> None:
        pass  # each push is visible to online reads at once

    def close(self) -> None:
        self.store = None
