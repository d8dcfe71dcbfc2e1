"""One model, two kinds of work: online requests first, batch work in the gaps.

The server's batcher (online requests) and the batch service's jobs call the same model,
set up once. :class:`ModelShare` decides who calls it: one call at a time, and a batch step
starts only once no online request has been waiting or running for ``gap_s`` (half a step:
closed-loop clients send their next request within it, so a steady online load is not cut
into by batch steps). An online request that arrives while a batch step runs waits for
that step alone, so batch steps are kept short while online traffic comes in (``step_s``,
about what one step may take) and grow back, doubling, to the job's whole calls once
online traffic has been quiet for ``quiet_s``.

:class:`SharedModel` is the adapter a batch job sees: the server's, already set up (its
``setup`` and ``close`` do nothing), whose ``predict`` runs a call as steps through the share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..adapters import Adapter, SetupContext, to_arrow_column

__all__ = ["ModelShare", "SharedModel"]


class ModelShare:
    """Who calls the model next: online work, then batch steps sized to leave it waiting little."""

    def __init__(self, step_s: float, quiet_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.step_s, self.quiet_s, self.clock = step_s, quiet_s, clock
        self.gap_s = step_s / 2
        self._cond = threading.Condition()
        self._model = threading.Lock()
        self._online = 0  # online rows queued or running
        self._last_online = float("-inf")
        self._row_s: float | None = None  # a batch row's seconds, smoothed over recent steps
        self._grown = 0  # rows of the last step while online traffic is quiet
        self.yielded_s = 0.0  # seconds batch work waited for online work
        self.batch_rows = 0

    # -- the online side (the batcher) --------------------------------------------
    def online_queued(self, rows: int) -> None:
        with self._cond:
            self._online += rows
            self._last_online = self.clock()

    def online_done(self, rows: int) -> None:
        with self._cond:
            self._online -= rows
            self._last_online = self.clock()
            if self._online <= 0:
                self._cond.notify_all()

    @contextmanager
    def online_call(self) -> Iterator[None]:
        """Hold the model for one online call (waits for a batch step already running)."""
        with self._model:
            yield

    # -- the batch side --------------------------------------------------------
    def step_rows(self, total: int) -> int:
        """Rows of the next batch step of a call of ``total`` rows."""
        with self._cond:
            busy = self.clock() - self._last_online < self.quiet_s
            if self._row_s is None:  # nothing measured yet: one row, then sized by what it took
                return 1 if busy else total
            fit = max(1, int(self.step_s / max(self._row_s, 1e-9)))
            if busy:
                self._grown = fit
            else:  # online traffic stopped: grow back to whole calls
                self._grown = max(fit, 2 * self._grown)
            return min(total, self._grown)

    def _wait_for_a_gap(self) -> None:
        with self._cond:
            while True:
                if self._online > 0:
                    self._cond.wait(0.5)
                    continue
                quiet = self.clock() - self._last_online
                if quiet >= self.gap_s:
                    return
                self._cond.wait(self.gap_s - quiet)

    @contextmanager
    def batch_step(self, rows: int) -> Iterator[None]:
        """Hold the model for one batch step, once no online request waits or just went."""
        t0 = self.clock()
        while True:
            self._wait_for_a_gap()
            self._model.acquire()
            if self._online <= 0:  # none came in while this step took the model
                break
            self._model.release()
        waited = self.clock() - t0
        start = self.clock()
        try:
            yield
        finally:
            self._model.release()
            took = self.clock() - start
            with self._cond:
                self.yielded_s += waited
                self.batch_rows += rows
                per_row = took / max(1, rows)
                self._row_s = per_row if self._row_s is None else 0.7 * self._row_s + 0.3 * per_row


@dataclass
class _Rows:
    """The rows a batch job selected for one call: the features they come from, and which."""

    features: Any
    idx: np.ndarray


class SharedModel(Adapter):
    """The server's adapter as a batch job's: set up already, called in steps through ``share``."""

    def __init__(self, inner: Adapter, share: ModelShare) -> None:
        self.inner, self.share = inner, share
        self.input_columns = inner.input_columns
        self.batch_size_hint = inner.batch_size_hint

    def __getattr__(self, name: str) -> Any:
        """What the job reads of the model (``dimension``, ``engine_name``...) is the server's."""
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def setup(self, ctx: SetupContext) -> None:
        """Set up by the server already."""

    def close(self) -> None:
        """The server closes its model."""

    def preprocess(self, table: pa.Table) -> Any:
        return self.inner.preprocess(table)

    def cost(self, features: Any) -> Any:
        return self.inner.cost(features)

    def select(self, features: Any, indices: np.ndarray) -> _Rows:
        if isinstance(features, _Rows):
            return _Rows(features.features, features.idx[indices])
        return _Rows(features, np.asarray(indices))

    def predict(self, batch: Any) -> Mapping[str, pa.Array]:
        rows = batch if isinstance(batch, _Rows) else _Rows(batch, np.arange(_length(batch)))
        pieces: list[dict[str, pa.Array]] = []
        start, total = 0, len(rows.idx)
        while start < total:
            n = self.share.step_rows(total - start)
            part = rows.idx[start : start + n]
            with self.share.batch_step(len(part)):
                columns = self.inner.postprocess(self.inner.predict(self.inner.select(rows.features, part)))
            pieces.append({name: to_arrow_column(values, name) for name, values in columns.items()})
            start += n
        if len(pieces) == 1:
            return pieces[0]
        return {name: pa.concat_arrays([p[name] for p in pieces]) for name in pieces[0]}

    def postprocess(self, outputs: Any) -> Mapping[str, Any]:
        return dict(outputs)


def _length(features: Any) -> int:
    if isinstance(features, pa.Table | pa.RecordBatch):
        return features.num_rows
    return len(features)
