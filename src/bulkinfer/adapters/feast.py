"""A model fed its features from Feast (``source.kind = "feast"``): the rows are entity keys and
event times; each window's features are read as of those times (point in time) and given to the
model as the feature columns it was trained on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from .protocol import Adapter, Wrapped

__all__ = ["FeastFed"]

WINDOW_ROWS = 16_384
"""Rows per Feast call at least: Feast's file offline store reads its sources whole at every call,
so calls are few and large (a shard is one call: see ``shard_rows``)."""


class FeastFed(Wrapped):
    """``inner`` (a model over feature columns) fed each row's features as ``reader`` finds them
    for the rows' ``columns`` (the entity key and event time; online, the key alone); ``definitions``:
    the digest of the feature views read."""

    def __init__(
        self,
        inner: Adapter,
        reader: Callable[[pa.Table], pa.Table],
        columns: Sequence[str],
        shard_rows: int,
        definitions: str,
    ) -> None:
        super().__init__(inner)
        self.reader = reader
        self.input_columns = tuple(columns)
        self.identity = {"source.feast_definitions": definitions}  # a changed feature view is another job
        self.window_rows = max(inner.window_rows or 0, WINDOW_ROWS, shard_rows)  # a shard's rows in one call

    def preprocess(self, table: pa.Table) -> Any:
        return self.inner.preprocess(self.reader(table))
