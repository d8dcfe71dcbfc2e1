"""``bulkinfer skew OUT``: online/offline skew of a Feast-sourced job's features, measured. For a
sample of the output's entities (those whose ids hash lowest: the same every time), their features
are read from the online store now and from the offline store as of now, the job's model predicts
on both, and each feature and output column says how many entities differ and by how much.

It lives beside ``serve`` because it answers the question ``serve.features`` raises: does the
server see the features the batch job saw?
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..adapters import job_setup_context, predict_table
from ..adapters.feast import FeastFed
from ..config import JobConfig
from ..core.errors import ConfigError
from ..finished.read import finished_output
from ..outputs.compare import lowest_ids
from ..precision.settle import settle
from ..sources.feast import OnlineFeatures

__all__ = ["Skew", "measure_skew"]


@dataclass
class Skew:
    """Per feature and per output column: how many sampled entities differ, and the largest difference."""

    entities: int
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def worst_share(self) -> float:
        """The largest share of entities that differ on any one feature or output column."""
        counts = [v["differ"] for v in [*self.features.values(), *self.outputs.values()]]
        return max(counts, default=0) / self.entities if self.entities else 0.0


def measure_skew(out: str, sample: int = 100, tolerance: float = 1e-9) -> Skew:
    """Online against offline (as of now) for ``sample`` of ``out``'s entities."""
    parts, job = finished_output(out, "checked for skew")
    cfg = JobConfig.model_validate(job["config"])
    src = cfg.source
    if src.kind != "feast" or not src.id_column:
        raise ConfigError(f"{out}: its job read no Feast features (source.kind = {src.kind!r}); skew needs such a job")
    ids = lowest_ids(parts, src.id_column, sample)
    if ids is None:
        raise ConfigError(f"{out}: the output has no rows to check")
    offline_cfg = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"features": False})})
    settled = settle(offline_cfg, online=True)  # the job's own reader (point in time), whatever serve says
    adapter = settled.adapter
    assert isinstance(adapter, FeastFed)
    adapter.setup(job_setup_context(settled.cfg, online=True))
    try:
        now = pa.array([dt.datetime.now(dt.UTC)] * len(ids), pa.timestamp("us", "UTC"))
        offline = adapter.reader(pa.table({src.id_column: ids, src.timestamp_column: now}))
        online_reader = OnlineFeatures(src.feast_repo, src.features, src.id_column, src.feature_service)
        online_reader.setup()
        online = online_reader(pa.table({src.id_column: ids}))
        size = settled.cfg.runtime.batch_size
        batch = size if isinstance(size, int) else 1024
        predicted = [predict_table(adapter.inner, t, batch) for t in (offline, online)]
    finally:
        adapter.close()
    skew = Skew(len(ids))
    skew.features = {n: _difference(offline.column(n), online.column(n), tolerance) for n in offline.column_names}
    skew.outputs = {n: _difference(predicted[0][n], predicted[1][n], tolerance) for n in predicted[0]}
    return skew


def _difference(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray, tolerance: float) -> dict[str, Any]:
    """How many values differ (a missing value against a present one counts) and the largest gap."""
    differ, largest = 0, 0.0
    for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True):
        if x is None or y is None or isinstance(x, str) or isinstance(y, str):
            gap = 0.0 if x == y else math.inf
        else:
            gap = float(np.max(np.abs(np.asarray(x, float) - np.asarray(y, float))))
        if gap > tolerance:
            differ += 1
            largest = max(largest, gap)
    return {"differ": differ, "max_abs_difference": largest}
