"""The local runner: one process, three threads joined by bounded queues.

::

    producer thread   read shard -> window of rows -> adapter.preprocess -> plan batches -> select
        │ queue (runtime.prefetch_batches items)
    calling thread    adapter.predict -> postprocess -> scatter back to input order
        │ queue (2 shards)
    writer thread     serialise -> temp file -> fsync -> rename -> ledger commit

Reading and tokenizing the next batches overlap with inference on the current one, and
memory is bounded by the queue depths, ``runtime.sort_window`` and ``source.shard_rows``,
never by the size of the input.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..adapters import Adapter, to_arrow_column
from ..batching import plan_batches, restore_order
from ..config import JobConfig
from ..errors import BulkinferError, Interrupted, ModelError
from ..report import RunStats
from ..sources import Shard, read_shard

__all__ = ["LocalRunner", "ShardOutput"]

_STOP = object()
_INTERRUPTED = "interrupted by a signal; committed shards are kept, rerun the same command to resume"


@dataclass
class ShardOutput:
    """All rows of one shard, in input order, ready to be written."""

    shard: Shard
    table: pa.Table


@dataclass
class _Batch:
    shard: int
    indices: np.ndarray
    payload: Any


@dataclass
class _WindowEnd:
    shard: int
    passthrough: pa.Table
    n_rows: int
    batches: list[np.ndarray]


@dataclass
class _ShardEnd:
    shard: Shard


@dataclass
class _Failure:
    error: BaseException


@dataclass
class _ShardState:
    windows: list[pa.Table] = field(default_factory=list)
    outputs: list[tuple[np.ndarray, dict[str, pa.Array]]] = field(default_factory=list)


class LocalRunner:
    """Runs shards through an adapter that is already set up."""

    def __init__(self, cfg: JobConfig, adapter: Adapter, stats: RunStats, stop: threading.Event) -> None:
        self.cfg = cfg
        self.adapter = adapter
        self.stats = stats
        self.stop = stop
        self._halt = threading.Event()
        passthrough = [c for c in [cfg.source.id_column, *cfg.sink.keep_columns] if c]
        self.passthrough = list(dict.fromkeys(passthrough))
        self.columns = list(dict.fromkeys([*adapter.input_columns, *self.passthrough]))

    # -- producer ------------------------------------------------------------
    def _windows(self, shard: Shard) -> Iterator[pa.Table]:
        window = self.cfg.runtime.sort_window
        pending: list[pa.RecordBatch] = []
        rows = 0
        t0 = time.perf_counter()
        for batch in read_shard(shard, self.columns, self.cfg.source.read_batch_rows):
            pending.append(batch)
            rows += batch.num_rows
            while rows >= window:
                table = pa.Table.from_batches(pending)
                self.stats.add_time("read", time.perf_counter() - t0)
                yield table.slice(0, window)
                rest = table.slice(window)
                pending, rows = rest.to_batches(), rest.num_rows
                t0 = time.perf_counter()
        self.stats.add_time("read", time.perf_counter() - t0)
        if rows:
            yield pa.Table.from_batches(pending, schema=pending[0].schema)

    def _produce(self, shards: Sequence[Shard], q: queue.Queue[Any]) -> None:
        rt = self.cfg.runtime
        try:
            for shard in shards:
                for table in self._windows(shard):
                    if self.stop.is_set() or self._halt.is_set():
                        return
                    t0 = time.perf_counter()
                    features = self.adapter.preprocess(table)
                    costs = self.adapter.cost(features)
                    batches = plan_batches(costs, table.num_rows, rt.batch_size, rt.max_tokens)
                    items = []
                    for idx in batches:
                        items.append(_Batch(shard.index, idx, self.adapter.select(features, idx)))
                        if costs is not None:
                            lens = [costs[i] for i in idx]
                            self.stats.add_batch(len(idx), sum(lens), max(lens) * len(idx))
                        else:
                            self.stats.add_batch(len(idx))
                    self.stats.add_time("preprocess", time.perf_counter() - t0)
                    for item in items:
                        q.put(item)
                    q.put(_WindowEnd(shard.index, table.select(self.passthrough), table.num_rows, batches))
                q.put(_ShardEnd(shard))
        except BaseException as exc:  # handed to the calling thread, which raises it
            q.put(_Failure(exc))
        finally:
            q.put(_STOP)

    # -- inference -------------------------------------------------------------
    def _predict(self, item: _Batch) -> dict[str, pa.Array]:
        t0 = time.perf_counter()
        try:
            columns = self.adapter.postprocess(self.adapter.predict(item.payload))
        except BulkinferError:
            raise
        except Exception as exc:
            raise ModelError(
                f"model call failed on a batch of {len(item.indices)} rows of shard "
                f"{item.shard} ({type(exc).__name__}: {exc})"
            ) from exc
        out = {name: to_arrow_column(values, name) for name, values in columns.items()}
        for name, arr in out.items():
            if len(arr) != len(item.indices):
                raise ModelError(f"output {name!r} has {len(arr)} values for a batch of {len(item.indices)} rows")
        self.stats.add_time("infer", time.perf_counter() - t0)
        return out

    def _assemble(self, state: _ShardState, end: _WindowEnd) -> pa.Table:
        parts = state.outputs
        state.outputs = []
        names = list(parts[0][1]) if parts else []
        clash = [n for n in names if n in end.passthrough.column_names]
        if clash:
            raise ModelError(
                f"output column {clash[0]!r} clashes with a kept input column; drop it from sink.keep_columns"
            )
        order = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, dtype=np.int64)
        table = end.passthrough
        if self.cfg.sink.preserve_order:
            inverse = restore_order([p[0] for p in parts], end.n_rows)
        else:
            inverse = np.arange(end.n_rows)
            table = table.take(pa.array(order))
        for name in names:
            col = pa.concat_arrays([p[1][name] for p in parts]).take(pa.array(inverse))
            table = table.append_column(name, col)
        return table

    def run(self, shards: Sequence[Shard], emit: Callable[[ShardOutput], None]) -> None:
        """Process ``shards``; ``emit`` is called (in the writer thread) with each finished shard."""
        q: queue.Queue[Any] = queue.Queue(maxsize=self.cfg.runtime.prefetch_batches)
        done: queue.Queue[Any] = queue.Queue(maxsize=2)
        writer_error: list[BaseException] = []

        def write_loop() -> None:
            while (item := done.get()) is not _STOP:
                if writer_error:
                    continue
                t0 = time.perf_counter()
                try:
                    emit(item)
                except BaseException as exc:
                    writer_error.append(exc)
                self.stats.add_time("write", time.perf_counter() - t0)

        producer = threading.Thread(target=self._produce, args=(shards, q), name="bulkinfer-read", daemon=True)
        writer = threading.Thread(target=write_loop, name="bulkinfer-write", daemon=True)
        producer.start()
        writer.start()
        states: dict[int, _ShardState] = {}
        try:
            while True:
                t0 = time.perf_counter()
                item = q.get()
                self.stats.wait_for_input_s += time.perf_counter() - t0
                if item is _STOP:
                    break
                if isinstance(item, _Failure):
                    raise item.error
                if writer_error:
                    raise writer_error[0]
                if self.stop.is_set():
                    raise Interrupted(_INTERRUPTED)
                if isinstance(item, _Batch):
                    states.setdefault(item.shard, _ShardState()).outputs.append((item.indices, self._predict(item)))
                elif isinstance(item, _WindowEnd):
                    state = states.setdefault(item.shard, _ShardState())
                    state.windows.append(self._assemble(state, item))
                elif isinstance(item, _ShardEnd):
                    state = states.pop(item.shard.index, _ShardState())
                    table = pa.concat_tables(state.windows) if state.windows else pa.table({})
                    done.put(ShardOutput(item.shard, table))
            if self.stop.is_set():
                raise Interrupted(_INTERRUPTED)
        finally:
            self._halt.set()
            _drain(q, producer)
            done.put(_STOP)
            writer.join()
        if writer_error:
            raise writer_error[0]


def _drain(q: queue.Queue[Any], producer: threading.Thread) -> None:
    """Unblock and finish the producer after the consumer stopped early."""
    while producer.is_alive():
        with contextlib.suppress(queue.Empty):
            q.get(timeout=0.05)
