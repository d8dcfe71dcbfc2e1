"""A shard's rows on their way through the model, window by window: what the reader queues
(:class:`Batch`, :class:`WindowEnd`, :class:`ShardEnd`), the bisection that isolates the rows
a model call fails on, and the assembly of each window's results back into input order
(:class:`Assembler`), with the rows that took their result from elsewhere (a previous
output, an identical input) and the error records of the rows that failed.

The local runner drives these from its threads; a Ray worker runs the local runner, so both
backends assemble the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.batching import bisect_call, restore_order
from ..core.errors import BulkinferError, ModelError
from ..core.layout import HASH_COLUMN, result_columns
from ..core.records import ErrorRecord
from ..sources import Shard
from ..sources.shard import ShardOutput
from .reuse import Reuse

__all__ = ["Assembler", "Batch", "Failure", "ShardEnd", "ShardState", "WindowEnd", "isolate", "row_id"]

Pieces = list[tuple[np.ndarray, dict[str, pa.Array]]]
"""Results as (window positions, columns) pairs, in any order."""


class _Computed:
    """The results a window inferred, by window position: where each input's result is, and why
    an input that has none failed."""

    def __init__(self, computed: Pieces, end: WindowEnd, failed: dict[int, BaseException]) -> None:
        self.at = np.concatenate([p[0] for p in computed]) if computed else np.empty(0, np.int64)
        self.cols = {n: pa.concat_arrays([p[1][n] for p in computed]) for n in computed[0][1]} if computed else {}
        self.order = np.argsort(self.at)
        self.end, self.failed = end, failed
        self.pre = {e.row: e for e in end.errors if e.row is not None}

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which ``positions`` were inferred, and their index in ``cols``."""
        at, order = self.at, self.order
        loc = np.searchsorted(at[order], positions)
        ok = loc < len(at)
        ok[ok] = at[order][loc[ok]] == positions[ok]
        return ok, order[loc[ok]]

    def why(self, src: int) -> tuple[str, str]:
        """The stage and message of the failure of the input at window position ``src``."""
        cause = self.failed.get(src) or self.pre.get(int(self.end.rows[src]))
        if isinstance(cause, ErrorRecord):
            return cause.stage, cause.message
        return "predict", str(cause)


@dataclass
class Batch:
    """One model call's rows, queued by the reader."""

    shard: int
    rows: np.ndarray  # positions in the window
    feature_idx: np.ndarray  # positions in the window's features (what ``select`` takes)
    payload: Any
    features: Any


@dataclass
class WindowEnd:
    """Queued after a window's batches: what the assembly needs besides their results."""

    shard: Shard
    rows: np.ndarray  # each window position's row number in the file
    passthrough: pa.Table
    errors: list[ErrorRecord]
    next_row: int  # the first row after this window (rows before it are done once it is assembled)
    reuse: Reuse = field(default_factory=Reuse)  # what the window takes instead of inferring it


@dataclass
class ShardEnd:
    """Queued after a shard's last window (``error``: it could not be read from ``failed_from``)."""

    shard: Shard
    failed_from: int | None = None
    error: BaseException | None = None
    stop: int | None = None  # the shard was split: its rows end here


@dataclass
class Failure:
    """The reader's own failure, raised by the thread that calls the model."""

    error: BaseException


@dataclass
class ShardState:
    """A shard being assembled: its finished windows, errors and the current window's results."""

    shard: Shard
    done_rows: int = 0
    windows: list[pa.Table] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    pieces: Pieces = field(default_factory=list)
    batch_errors: list[tuple[int, BaseException]] = field(default_factory=list)


def row_id(table: pa.Table, pos: int, id_column: str | None) -> Any:
    """The id of the row at ``pos`` (None without an id column)."""
    return table.column(id_column)[pos].as_py() if id_column and id_column in table.column_names else None


def isolate(
    item: Batch,
    call: Callable[[np.ndarray], dict[str, pa.Array]],
    shrink: Callable[[np.ndarray, BaseException], None],
    state: ShardState,
) -> None:
    """After ``item``'s call failed as a whole: bisect over its rows so that only the rows the
    model fails on become errors (kept in ``state.batch_errors``) and the rest are results. A
    :class:`BulkinferError` is the job's, not a row's: it is raised."""
    to_row = dict(zip(item.feature_idx.tolist(), item.rows.tolist(), strict=True))
    done, failed = bisect_call(item.feature_idx, call, shrink, known_bad=True)
    for idx, cols in done:
        state.pieces.append((np.array([to_row[int(i)] for i in idx], dtype=np.int64), cols))
    for feature_row, err in failed:
        if isinstance(err, BulkinferError):
            raise err
        state.batch_errors.append((to_row[feature_row], err))


class Assembler:
    """Puts each window's results back in input order (or not: ``sink.preserve_order``) beside
    the kept input columns, and records the rows that failed."""

    def __init__(self, preserve_order: bool, id_column: str | None) -> None:
        self.preserve_order = preserve_order
        self.id_column = id_column
        self.out_types: dict[str, pa.DataType] = {}  # the model's output types, for results taken from slots

    def assemble(self, state: ShardState, end: WindowEnd) -> None:
        computed, state.pieces = state.pieces, []
        batch_errors, state.batch_errors = state.batch_errors, []
        state.errors.extend(end.errors)
        for pos, exc in batch_errors:
            self.fail_row(state, end, pos, "predict", exc)
        reuse = end.reuse
        pieces = computed + reuse.reused
        if reuse.dupes is not None or reuse.owned is not None or reuse.deferred is not None:
            pieces += self._fan_out(computed, end, dict(batch_errors), state)
        rows, take = restore_order([p[0] for p in pieces])
        names = list(pieces[0][1]) if pieces else []
        clash = [n for n in names if n in end.passthrough.column_names]
        if clash:
            raise ModelError(
                f"output column {clash[0]!r} clashes with a kept input column; drop it from sink.keep_columns"
            )
        if self.preserve_order:
            keep, order = rows, pa.array(take)
        else:
            keep = np.concatenate([p[0] for p in pieces]) if pieces else np.empty(0, dtype=np.int64)
            order = None
        arrays = [col.take(pa.array(keep)) for col in end.passthrough.columns]
        for name in names:
            parts = [p[1][name] for p in pieces]
            first = parts[0].type  # results taken from elsewhere get the model's own type
            col = pa.concat_arrays([a if a.type == first else a.cast(first) for a in parts])
            arrays.append(col if order is None else col.take(order))
        table = pa.Table.from_arrays(arrays, names=[*end.passthrough.column_names, *names])
        if HASH_COLUMN in end.passthrough.column_names:  # bulkinfer's own column goes after the results
            table = table.select([*result_columns(table.column_names), HASH_COLUMN])
        if table.num_rows:
            state.windows.append(table)
        state.done_rows = end.next_row - state.shard.start

    def _fan_out(self, computed: Pieces, end: WindowEnd, failed: dict[int, BaseException], state: ShardState) -> Pieces:
        """Fill the slots of the inputs inferred here (for later windows), copy results to the rows
        of this window that repeat an input, and take the results earlier windows computed. A row
        whose source failed fails the same way."""
        here = _Computed(computed, end, failed)
        if here.cols:
            self.out_types = self.out_types or {n: c.type for n, c in here.cols.items()}
        out: Pieces = []
        if end.reuse.owned is not None:
            positions, slots = end.reuse.owned
            ok, idx = here.locate(positions)
            values = {n: c.take(pa.array(idx)).to_pylist() for n, c in here.cols.items()}
            for j, slot in enumerate(s for s, good in zip(slots, ok, strict=True) if good):
                slot.values = {n: v[j] for n, v in values.items()}
            for pos, slot, good in zip(positions.tolist(), slots, ok.tolist(), strict=True):
                if not good:
                    stage, message = here.why(pos)
                    slot.failed = f"{stage}: {message}"
        if end.reuse.dupes is not None:
            dup, src = end.reuse.dupes
            ok, idx = here.locate(src)
            if ok.any():
                out.append((dup[ok], {n: c.take(pa.array(idx)) for n, c in here.cols.items()}))
            for d, s_ in zip(dup[~ok].tolist(), src[~ok].tolist(), strict=True):
                stage, message = here.why(s_)
                self.fail_row(state, end, d, stage, f"same input as row {int(end.rows[s_])}: {message}")
        if end.reuse.deferred is not None:
            out += self._deferred(end, state)
        return out

    def _deferred(self, end: WindowEnd, state: ShardState) -> Pieces:
        """The rows whose input an earlier window computed: its results, or its failure."""
        assert end.reuse.deferred is not None
        positions, slots = end.reuse.deferred
        out: Pieces = []
        filled = [(p, s.values) for p, s in zip(positions.tolist(), slots, strict=True) if s.values is not None]
        if filled:
            rows = np.array([p for p, _ in filled], np.int64)
            out.append((rows, {n: pa.array([v[n] for _, v in filled], t) for n, t in self.out_types.items()}))
        for p, s_ in zip(positions.tolist(), slots, strict=True):
            if s_.values is None:
                self.fail_row(state, end, p, "predict", f"same input as an earlier row: {s_.failed}")
        return out

    def fail_row(self, state: ShardState, end: WindowEnd, pos: int, stage: str, cause: BaseException | str) -> None:
        """Record that the row at window position ``pos`` failed."""
        rid = row_id(end.passthrough, pos, self.id_column)
        state.errors.append(ErrorRecord.of(end.shard.uri, int(end.rows[pos]), stage, cause, row_id=rid))

    @staticmethod
    def finish(state: ShardState, partial: bool = False) -> ShardOutput:
        """The shard's output: every assembled window (``partial``: the shard ends after them)."""
        shard = state.shard
        if partial:
            shard = replace(shard, stop=shard.start + state.done_rows)
        table = pa.concat_tables(state.windows) if state.windows else pa.table({})
        errors = sorted(state.errors, key=lambda e: (e.row is None, e.row or 0))  # in file order
        return ShardOutput(shard, table, errors)
