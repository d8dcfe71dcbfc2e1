"""Dynamic micro-batching: requests that arrive together share one model call.

One thread owns the model. It takes the first waiting request, lets others join for up to
``max_wait_s`` (0: those already waiting, i.e. that arrived while the model was busy) or
until ``max_rows`` rows are gathered, and runs the merged rows through the adapter the way
an offline run does, sorted by length, and cuts them into calls of at most ``batch_size``
rows where padding would cost more than another call (``call_overhead``, measured at
start-up by :func:`measure_call_overhead`): merging a 5-token and a 70-token text into
one padded call is slower than two calls on a CPU, faster on a GPU. Each request gets
its own rows back, with its token count (the tokenizing is done once, here).
When the merged call fails, the requests are bisected (the engine's
:func:`~bulkinfer.core.batching.bisect_call`) so a bad row fails only its own request. The
queue is bounded in rows: past ``max_queue_rows`` a request is refused at once
(:class:`Overloaded`) rather than left to time out. Its calls take the model through
``share`` (:class:`~.share.ModelShare`): batch work yields while online requests wait.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..adapters import Adapter, predict_features
from ..core.batching import bisect_call
from ..core.threads import thread
from .share import ModelShare

__all__ = ["Answer", "Batcher", "Overloaded", "measure_call_overhead"]


class Overloaded(Exception):
    """The queue is full; the client should retry later."""


@dataclass(frozen=True)
class Answer:
    """One request's output columns, and its inputs' cost (tokens; None for models without)."""

    columns: dict[str, pa.Array]
    tokens: int | None


@dataclass
class _Request:
    table: pa.Table
    future: Future[Answer] = field(default_factory=Future)


class Batcher:
    """Merges concurrent requests into model calls of at most ``max_rows`` rows."""

    def __init__(
        self,
        adapter: Adapter,
        *,
        max_rows: int,
        batch_size: int | None = None,
        call_overhead: float | None = None,
        max_wait_s: float,
        max_queue_rows: int,
        on_batch: Callable[[int, int], None] = lambda rows, requests: None,
        share: ModelShare | None = None,
    ) -> None:
        self.adapter = adapter
        self.max_rows = max_rows
        self.batch_size = batch_size or max_rows
        self.call_overhead = call_overhead
        self.max_wait_s = max_wait_s
        self.max_queue_rows = max_queue_rows
        self.on_batch = on_batch
        self.share = share or ModelShare(step_s=0.05)
        self.queued_rows = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._held: _Request | None = None  # the request that did not fit in the last batch
        self._thread = thread(self._loop, name="bulkinfer-batcher")
        self._thread.start()

    def submit(self, table: pa.Table) -> Future[Answer]:
        """Queue ``table``'s rows; the future gives its output columns (or the model's error)."""
        with self._lock:
            if self.queued_rows + table.num_rows > self.max_queue_rows and self.queued_rows > 0:
                raise Overloaded(f"{self.queued_rows} rows are waiting (serve.max_queue_rows={self.max_queue_rows})")
            self.queued_rows += table.num_rows
        self.share.online_queued(table.num_rows)
        request = _Request(table)
        self._queue.put(request)
        return request.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _next(self, timeout: float | None) -> _Request | None:
        if self._held is not None:
            held, self._held = self._held, None
            return held
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _loop(self) -> None:
        while True:
            first = self._next(None)
            if first is None:
                return
            batch, rows = [first], first.table.num_rows
            deadline = time.monotonic() + self.max_wait_s
            while rows < self.max_rows:
                nxt = self._next(max(0.0, deadline - time.monotonic()))
                if nxt is None:
                    break
                if rows + nxt.table.num_rows > self.max_rows:
                    self._held = nxt
                    break
                batch.append(nxt)
                rows += nxt.table.num_rows
            with self._lock:
                self.queued_rows -= rows
            self.on_batch(rows, len(batch))
            try:
                with self.share.online_call():
                    self._run(batch)
            finally:
                self.share.online_done(rows)

    def _infer(self, requests: list[_Request]) -> list[Answer]:
        merged = pa.concat_tables([r.table for r in requests], promote_options="permissive")
        features = self.adapter.preprocess(merged)
        costs = self.adapter.cost(features)
        columns = predict_features(self.adapter, features, merged.num_rows, self.batch_size, self.call_overhead)
        out, start = [], 0
        for r in requests:
            n = r.table.num_rows
            tokens = int(sum(costs[start : start + n])) if costs is not None else None
            out.append(Answer({name: col.slice(start, n) for name, col in columns.items()}, tokens))
            start += n
        return out

    def _run(self, batch: list[_Request]) -> None:
        try:
            for request, result in zip(batch, self._infer(batch), strict=True):
                request.future.set_result(result)
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
        done, failed = bisect_call(
            np.arange(len(batch)), lambda idx: self._infer([batch[i] for i in idx]), known_bad=True
        )
        for idx, results in done:
            for i, result in zip(idx, results, strict=True):
                batch[int(i)].future.set_result(result)
        for i, error in failed:
            batch[int(i)].future.set_exception(error)


def measure_call_overhead(
    adapter: Adapter, sample: pa.Table, repeats: int = 5, clock: Callable[[], float] = time.perf_counter
) -> float | None:
    """What one model call costs beyond its padded tokens, in tokens' worth of time: a
    one-row call of ``sample``'s first row against a call of all its rows (copies of one
    short input), median of ``repeats`` timed by ``clock``. None for adapters without
    per-row costs."""
    features = adapter.preprocess(sample)
    costs = adapter.cost(features)
    if costs is None or sample.num_rows < 2:
        return None

    def seconds(rows: int) -> float:
        idx = np.arange(rows)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            t0 = clock()
            adapter.predict(adapter.select(features, idx))
            times.append(clock() - t0)
        return float(np.median(times[1:]))

    one, many = seconds(1), seconds(sample.num_rows)
    per_token = (many - one) / ((sample.num_rows - 1) * max(1, costs[0]))
    if per_token <= one * 1e-3:  # a bigger call costs (almost) nothing more: merge all
        return 1e6
    return max(0.0, one / per_token - costs[0])
