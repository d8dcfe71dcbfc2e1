"""The adapter protocol: what bulkinfer needs from a model family.

Subclass :class:`Adapter` and override :meth:`Adapter.predict` (and whichever other
hook you need); bulkinfer calls the hooks in this order, for every shard::

    setup(ctx)                      once per worker, before any row
    preprocess(table) -> features   CPU work (tokenizing), runs in a thread beside inference
    cost(features) -> lengths|None  per-row cost for the token budget and length sorting
    select(features, idx)           the rows of one batch
    predict(batch) -> outputs       the model call
    postprocess(outputs) -> columns a mapping of output column name -> values, one per row

The same object serves online requests, so offline and online results cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.batching import plan_batches, restore_order
from ..core.errors import ModelError
from ..core.hardware import available_cpus
from ..core.tensors import column_array, tensor_column

__all__ = [
    "Adapter",
    "RowsRejected",
    "SetupContext",
    "Wrapped",
    "predict_features",
    "predict_table",
    "to_arrow_column",
    "to_numpy_column",
]


class RowsRejected(Exception):
    """Raised by :meth:`Adapter.preprocess` for rows it will not run (an invalid request, a prompt
    over the model's context): ``errors`` maps each row's position in the table to its error.
    Those rows become error records at once (no bisection) and the others are preprocessed again."""

    def __init__(self, errors: Mapping[int, Exception]) -> None:
        super().__init__(f"{len(errors)} rows rejected")
        self.errors = dict(errors)


@dataclass(frozen=True)
class SetupContext:
    """What an adapter may use while setting up."""

    threads: int = field(default_factory=available_cpus)
    device: str = "cpu"
    options: Mapping[str, Any] = field(default_factory=dict)
    # answering online requests: between calls the engine's threads must not busy-wait
    # for work, since the HTTP server needs those CPUs (offline, spinning is faster)
    online: bool = False


class Adapter:
    """Base class of every model adapter. Override :meth:`predict`; the rest has defaults."""

    #: Input columns the adapter reads; set by the constructor or the subclass.
    input_columns: Sequence[str] = ()
    #: Rows per model call when ``runtime.batch_size`` is not set: models that are cheap per
    #: row (trees, linear models) want batches of thousands; None keeps the default (16).
    batch_size_hint: int | None = None
    #: Rows read and preprocessed together when ``runtime.sort_window`` is not set; None: its
    #: default. Pictures keep it small: a decoded window is large and waits for the model.
    window_rows: int | None = None
    #: The output columns ``postprocess`` writes, where the adapter knows them before a row
    #: runs (a rule or another model reading a column is then checked at start); None: unknown.
    output_columns: Sequence[str] | None = None
    #: The input column holding each row's picture (its bytes or path) where the adapter decodes
    #: pictures: online, a request then sends them as an upload or base64; None: no pictures.
    picture_column: str | None = None
    #: What the adapter read from outside the job's settings and the model's file that changes its
    #: answers (a Feast feature view's definitions, digested): part of the job's identity, so a
    #: change there is another job. Empty: nothing.
    identity: Mapping[str, str] = MappingProxyType({})

    def setup(self, ctx: SetupContext) -> None:
        """Load the model. Called once per worker before any batch."""

    def preprocess(self, table: pa.Table) -> Any:
        """Turn input rows into features (runs in a background thread). Default: the table."""
        return table

    def cost(self, features: Any) -> Sequence[int] | None:
        """Per-row cost (e.g. token count) for budgets and length sorting; None: rows only."""
        return None

    def select(self, features: Any, indices: np.ndarray) -> Any:
        """The rows ``indices`` of ``features``: Arrow tables, numpy arrays, dicts and lists work."""
        if isinstance(features, pa.Table | pa.RecordBatch):
            return features.take(pa.array(indices, type=pa.int64()))
        if isinstance(features, np.ndarray):
            return features[indices]
        if isinstance(features, Mapping):
            return {k: self.select(v, indices) for k, v in features.items()}
        if isinstance(features, list):
            return [features[i] for i in indices]
        raise ModelError(
            f"{type(self).__name__}: cannot select rows of {type(features).__name__}; override Adapter.select"
        )

    def predict(self, batch: Any) -> Any:
        """Run the model on one batch."""
        raise NotImplementedError

    def postprocess(self, outputs: Any) -> Mapping[str, Any]:
        """Output columns, one value per row. Default: ``outputs`` must already be a mapping."""
        if isinstance(outputs, Mapping):
            return outputs
        return {"prediction": outputs}

    def take_figures(self) -> Mapping[str, Any]:
        """Figures measured since the last call, for report.json (several models: each one's
        seconds, rows and failures under ``models``; ``pictures_decoded``). Default: none."""
        return {}

    def close(self) -> None:
        """Release resources (called once at the end)."""


class Wrapped(Adapter):
    """An adapter around ``inner`` that changes one step (features made another way, answers cut):
    every step it does not override is ``inner``'s, and so are its hints and columns."""

    def __init__(self, inner: Adapter) -> None:
        self.inner = inner
        self.input_columns = inner.input_columns
        self.batch_size_hint, self.window_rows = inner.batch_size_hint, inner.window_rows
        self.output_columns, self.picture_column = inner.output_columns, inner.picture_column
        self.identity = inner.identity

    def setup(self, ctx: SetupContext) -> None:
        self.inner.setup(ctx)

    def preprocess(self, table: pa.Table) -> Any:
        return self.inner.preprocess(table)

    def cost(self, features: Any) -> Sequence[int] | None:
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


def to_arrow_column(values: Any, name: str = "column") -> pa.Array:
    """Convert adapter output (Arrow, numpy N-d: :func:`~bulkinfer.core.tensors.tensor_column`, list) to Arrow."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    if isinstance(values, np.ndarray) and values.ndim >= 2:  # a vector or a tensor a row
        return tensor_column(values)
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ModelError(f"output {name!r}: cannot convert to an Arrow column ({exc})") from exc


def to_numpy_column(column: pa.Array) -> np.ndarray:
    """An output column back as numpy: a fixed-size list column (embeddings) as a 2-D array, a tensor column N-d."""
    if pa.types.is_fixed_size_list(column.type) or isinstance(column.type, pa.FixedShapeTensorType):
        return column_array(column, "output")
    return column.to_numpy(zero_copy_only=False)


def predict_table(
    adapter: Adapter, table: pa.Table, batch_size: int, call_overhead: float | None = None
) -> dict[str, pa.Array]:
    """Every output column of ``adapter`` over ``table`` as Arrow arrays, in row order: the
    columns and types an offline run writes (the online server answers with these)."""
    return predict_features(adapter, adapter.preprocess(table), table.num_rows, batch_size, call_overhead)


def predict_features(
    adapter: Adapter, features: Any, n_rows: int, batch_size: int, call_overhead: float | None = None
) -> dict[str, pa.Array]:
    """:func:`predict_table` from rows already preprocessed (``adapter.preprocess``):
    calls of at most ``batch_size`` rows, cut by length (see :func:`plan_batches`)."""
    batches = plan_batches(adapter.cost(features), n_rows, batch_size, call_overhead=call_overhead)
    pieces = []
    for idx in batches:
        columns = adapter.postprocess(adapter.predict(adapter.select(features, idx)))
        pieces.append({name: to_arrow_column(values, name) for name, values in columns.items()})
    _rows, take = restore_order(batches)
    order = pa.array(take)
    out = {}
    for name in pieces[0] if pieces else []:
        column = pa.concat_arrays([p[name] for p in pieces])
        if len(column) != n_rows:
            raise ModelError(f"output {name!r} has {len(column)} values for {n_rows} rows")
        out[name] = column.take(order)
    return out
