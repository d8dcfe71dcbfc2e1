"""A model fed its features from Feast (``source.kind = "feast"``): the rows are entity keys and
event times; each window's features are read as of those times (point in time) and given to the
model as the feature columns it was trained on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .protocol import Adapter, SetupContext

__all__ = ["FeastFed"]

WINDOW_ROWS = 16_384
"""Rows per Feast call: the file offline store reads its sources once a call, so calls are few and
large; a shard of 10,000 rows is one call."""


class FeastFed(Adapter):
    """``inner`` (a model over feature columns) fed each row's features as ``reader`` finds them
    for the rows' ``columns`` (the entity key and event time; online, the key alone)."""

    def __init__(self, inner: Adapter, reader: Callable[[pa.Table], pa.Table], columns: Sequence[str]) -> None:
        self.inner, self.reader = inner, reader
        self.input_columns = tuple(columns)
        self.batch_size_hint = inner.batch_size_hint
        self.window_rows = max(inner.window_rows or 0, WINDOW_ROWS)
        self.output_columns = inner.output_columns

    def setup(self, ctx: SetupContext) -> None:
        self.inner.setup(ctx)

    def preprocess(self, table: pa.Table) -> Any:
        return self.inner.preprocess(self.reader(table))

    def cost(self, features: Any) -> Any:
        return self.inner.cost(features)

    def select(self, features: Any, indices: np.ndarray) -> Any:
        return self.inner.select(features, indices)

    def predict(self, batch: Any) -> Any:
        return self.inner.predict(batch)

    def postprocess(self, outputs: Any) -> Mapping[str, Any]:
        return self.inner.postprocess(outputs)

    def take_figures(self) -> Mapping[str, Any]:
        return self.inner.take_figures()

    def close(self) -> None:
        self.inner.close()
