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

Rows that make the adapter raise are isolated by bisection and become error records;
every other row is written. A shard that cannot be read becomes one error record for its
rows. When ``stop`` is set (SIGTERM), the windows of the current shard that are complete
are handed to the writer as a partial shard, so a resume continues from that row.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..adapters import Adapter, RowsRejected, job_setup_context, to_arrow_column
from ..config import JobConfig
from ..core.batching import bisect_call, plan_batches
from ..core.errors import BulkinferError, ModelError, SourceError
from ..core.layout import HASH_COLUMN
from ..core.records import ErrorRecord
from ..core.schema import parse_type
from ..core.threads import thread
from ..precision.gate import GateVerdict
from ..report import RunStats
from ..sources import ROW, Shard, read_shard
from .contract import BatchTimeout, Emit, Gate
from .reuse import WindowReuse
from .window import Assembler, Batch, Failure, ShardEnd, ShardState, WindowEnd, isolate, row_id

__all__ = ["LocalRunner"]

_STOP = object()
log = logging.getLogger("bulkinfer")


def _is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return isinstance(exc, MemoryError) or "OutOfMemory" in name or "Failed to allocate" in str(exc)


class LocalRunner:
    """Runs shards through an adapter that is already set up."""

    def __init__(self, cfg: JobConfig, adapter: Adapter, stats: RunStats, stop: threading.Event) -> None:
        self.cfg = cfg
        self.adapter = adapter
        self.stats = stats
        self.stop = stop
        self._halt = threading.Event()
        self.on_progress: Callable[[], None] = lambda: None
        self.row_filter: frozenset[int] | None = None  # only these rows (--retry-errors)
        self._filter_array = pa.array([], pa.int64())
        self.batch_size = cfg.runtime.rows_per_call
        self.passthrough = cfg.passthrough_columns
        self.columns = list(dict.fromkeys([*adapter.input_columns, *self.passthrough]))
        self.types = {c: parse_type(t) for c, t in cfg.source.column_types.items()}
        self._lock = threading.Lock()
        self._next_read: dict[int, int] = {}  # shard index -> first row not yet handed on
        self._limits: dict[int, int] = {}  # shard index -> the row it was split at
        self._reading: dict[int, Shard] = {}  # shard index -> the shard, from its first read to its end
        # results computed once (see bulkinfer.runners.reuse): from a previous output, or from identical rows
        self.reuse = WindowReuse(cfg, adapter.input_columns)
        self.assembler = Assembler(cfg.sink.preserve_order, cfg.source.id_column)

    # -- the runner contract -------------------------------------------------------
    def start(self, gate: Gate) -> GateVerdict:
        """Set the model up in this process, then run the quality gate."""
        t0 = time.perf_counter()
        self.adapter.setup(job_setup_context(self.cfg))
        t1 = time.perf_counter()
        # read now: the gate's int8 search reloads the engine (its builds are the gate's time)
        built = dict(getattr(self.adapter, "build_split", None) or {})
        self.reuse.load_previous()
        verdict = gate()
        if verdict.rows is not None:  # the gate's rows, already inferred by this model: output rows
            self.reuse.seed(verdict.rows.inputs, verdict.rows.outputs)
        self.stats.setup_split |= {  # the model's export and int8 build (when not cached), its load, the gate
            **built,
            "load_s": t1 - t0 - sum(built.values()),
            "gate_s": time.perf_counter() - t1,
        }
        self.stats.mark_running()
        return verdict

    @property
    def dedupe(self) -> bool | None:
        """Whether duplicate inputs are computed once (None: ``auto``, not decided yet)."""
        return self.reuse.dedupe

    def close(self) -> None:
        self.adapter.close()

    # -- splitting (stragglers): the protocol in runners/contract.py -------------------
    def progress(self) -> dict[int, int]:
        """The first row not yet read of each shard still being read."""
        with self._lock:
            return dict(self._next_read)

    def split(self, index: int, at: int, stop: int) -> int | None:
        """End shard ``index`` at row ``at`` or the first row after it not yet read, whichever
        is later; return that row, or None when the shard is read (or nearly) already.
        The caller owns the rows from there to ``stop``."""
        with self._lock:
            if index not in self._next_read:
                return None
            accepted = max(at, self._next_read[index])
            if accepted >= stop:
                return None
            self._limits[index] = min(accepted, self._limits.get(index, stop))
            return self._limits[index]

    def _cut(self, shard: Shard, table: pa.Table) -> tuple[pa.Table, int | None]:
        """Drop a window's rows at or after the split point, if the shard was split."""
        last = int(table.column(ROW)[-1].as_py())
        with self._lock:
            limit = self._limits.get(shard.index)
            if limit is None or limit > last:
                self._next_read[shard.index] = last + 1
                return table, None
            self._next_read.pop(shard.index, None)
        return table.filter(pc.less(table.column(ROW), limit)), limit

    # -- producer ------------------------------------------------------------
    def _windows(self, shard: Shard, on_bad_row: Callable[[int, str], None]) -> Iterator[pa.Table]:
        hint, rt = self.adapter.window_rows, self.cfg.runtime
        size = rt.sort_window if hint is None or "sort_window" in rt.model_fields_set else hint
        window = max(size, self.batch_size)  # a window holds at least one batch
        pending: list[pa.RecordBatch] = []
        rows = 0
        t0 = time.perf_counter()
        src = self.cfg.source
        for batch in read_shard(shard, self.columns, src.read_batch_rows, on_bad_row, self.types, src.max_record_bytes):
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

    def _wanted(self, row: int) -> bool:
        return self.row_filter is None or row in self.row_filter

    def _preprocess(self, shard: Shard, rows: np.ndarray, table: pa.Table) -> tuple[Any, np.ndarray, list[ErrorRecord]]:
        """Features of the window's good rows, their positions, and error records for the bad ones.
        An adapter may name its bad rows (``RowsRejected``) on any pass, the rows left included;
        any other failure is bisected to the rows that cause it."""
        good = np.arange(table.num_rows)
        failed: list[tuple[int, BaseException]] = []
        while len(good):
            try:
                features = self.adapter.preprocess(table if len(good) == table.num_rows else table.take(pa.array(good)))
                break
            except BulkinferError:
                raise
            except RowsRejected as rejected:  # the adapter named its bad rows: no bisection
                named: list[tuple[int, BaseException]] = [(int(good[i]), e) for i, e in rejected.errors.items()]
            except Exception:
                _ok, bisected = bisect_call(
                    good, lambda idx: self.adapter.preprocess(table.take(pa.array(idx))), known_bad=True
                )
                named = [(int(pos), exc) for pos, exc in bisected]
                if not named:  # no row fails alone: the call itself does, and says why
                    features = self.adapter.preprocess(table.take(pa.array(good)))
                    break
            failed += named
            bad = {pos for pos, _exc in named}
            good = np.array([p for p in good if p not in bad], dtype=np.int64)
        else:
            features = None
        id_column = self.cfg.source.id_column
        errors = [
            ErrorRecord.of(shard.uri, int(rows[pos]), "preprocess", exc, row_id=row_id(table, pos, id_column))
            for pos, exc in sorted(failed, key=lambda f: f[0])
        ]
        return features, good, errors

    def _batches(self, shard: Shard, features: Any, good: np.ndarray) -> list[Batch]:
        items: list[Batch] = []
        costs = self.adapter.cost(features)
        for idx in plan_batches(costs, len(good), self.batch_size, self.cfg.runtime.max_tokens):
            items.append(Batch(shard.index, good[idx], idx, self.adapter.select(features, idx), features))
            if costs is not None:
                lens = [costs[i] for i in idx]
                self.stats.add_batch(len(idx), sum(lens), max(lens) * len(idx))
            else:
                self.stats.add_batch(len(idx))
        return items

    def _produce_shard(self, shard: Shard, q: queue.Queue[Any]) -> bool:
        """Queue the shard's batches and window ends; False when told to stop."""
        bad_rows: list[tuple[int, str]] = []
        next_row = shard.start
        with self._lock:
            self._next_read[shard.index] = shard.start
            self._limits.pop(shard.index, None)
            self._reading[shard.index] = shard
        try:
            for window in self._windows(shard, lambda row, msg: bad_rows.append((row, msg))):
                if self.stop.is_set() or self._halt.is_set():
                    return False
                next_row, limit = self._produce_window(shard, window, bad_rows, q)
                if limit is not None:
                    q.put(ShardEnd(shard, stop=limit))
                    return True
        except SourceError as exc:
            q.put(ShardEnd(shard, failed_from=next_row, error=exc))
            return True
        finally:
            with self._lock:
                self._next_read.pop(shard.index, None)
        with self._lock:  # split after the last window was read: the tail is empty
            limit = self._limits.get(shard.index)
        if bad_rows:  # rows after the last good one
            errors = [
                ErrorRecord.of(shard.uri, r, "read", m)
                for r, m in bad_rows
                if self._wanted(r) and (limit is None or r < limit)
            ]
            empty = pa.table({c: pa.array([], pa.null()) for c in self.passthrough})
            q.put(WindowEnd(shard, np.empty(0, dtype=np.int64), empty, errors, limit or shard.stop))
        q.put(ShardEnd(shard, stop=limit))
        return True

    def _produce_window(
        self, shard: Shard, window: pa.Table, bad_rows: list[tuple[int, str]], q: queue.Queue[Any]
    ) -> tuple[int, int | None]:
        """Queue one window's batches (what reuse leaves to compute, preprocessed) and its end
        (passthrough columns, read errors up to its last row, the reuse plan). Returns the next
        row to read and the shard's new end when a split cut it inside this window."""
        t0 = time.perf_counter()
        last = int(window.column(ROW)[-1].as_py())
        table, limit = self._cut(shard, window)
        if limit is not None:
            last = limit - 1
        errors = [ErrorRecord.of(shard.uri, r, "read", m) for r, m in bad_rows if r <= last and self._wanted(r)]
        bad_rows[:] = [(r, m) for r, m in bad_rows if r > last]
        if self.row_filter is not None:
            table = table.filter(pc.is_in(table.column(ROW), value_set=self._filter_array))
        rows = table.column(ROW).to_numpy()
        table = table.drop_columns([ROW])
        reuse = self.reuse.plan(table, self.stats)
        sub = table if reuse.compute is None else table.take(pa.array(reuse.compute))
        sub_rows = rows if reuse.compute is None else rows[reuse.compute]
        features, good, pre_errors = (
            self._preprocess(shard, sub_rows, sub) if sub.num_rows else (None, np.empty(0, np.int64), [])
        )
        self.stats.add_truncated(getattr(features, "truncated", 0))
        if reuse.compute is not None:
            good = reuse.compute[good]  # positions in the window, as the assembly expects
        items = self._batches(shard, features, good) if len(good) else []
        self.stats.add_time("preprocess", time.perf_counter() - t0)
        for item in items:
            q.put(item)
        next_row = max([last, *(e.row for e in errors if e.row is not None)]) + 1
        passthrough = table.select(self.passthrough)
        if self.reuse.write_hash:
            passthrough = passthrough.append_column(HASH_COLUMN, pa.array(reuse.hashes, pa.uint64()))
        q.put(WindowEnd(shard, rows, passthrough, errors + pre_errors, next_row, reuse))
        return next_row, limit

    def _produce(self, shards: Sequence[Shard], q: queue.Queue[Any]) -> None:
        try:
            for shard in shards:
                if not self._produce_shard(shard, q):
                    return
        except BaseException as exc:  # handed to the calling thread, which raises it
            q.put(Failure(exc))
        finally:
            q.put(_STOP)

    # -- inference -------------------------------------------------------------
    def _call(self, item: Batch, feature_idx: np.ndarray | None) -> dict[str, pa.Array]:
        payload = item.payload if feature_idx is None else self.adapter.select(item.features, feature_idx)
        timeout = self.cfg.runtime.batch_timeout_s
        if timeout is None:
            columns = self.adapter.postprocess(self.adapter.predict(payload))
        else:
            columns = _with_timeout(lambda: self.adapter.postprocess(self.adapter.predict(payload)), timeout)
        n = len(item.rows) if feature_idx is None else len(feature_idx)
        out = {name: to_arrow_column(values, name) for name, values in columns.items()}
        for name, arr in out.items():
            if len(arr) != n:
                raise ModelError(
                    f"output {name!r} has {len(arr)} values for a batch of {n} rows; "
                    "an adapter must return one value per row"
                )
        if "completion_tokens" in out and "prompt_tokens" in out:  # a generation model's tokens in and out
            self.stats.add_generated(_total(out["prompt_tokens"]), _total(out["completion_tokens"]))
        return out

    def _shrink(self, part: np.ndarray, exc: BaseException) -> None:
        """After an out-of-memory error, later batches are at most half the failed one."""
        if _is_oom(exc):
            self.batch_size = max(1, min(self.batch_size, len(part)) // 2)

    def _predict(self, item: Batch, state: ShardState) -> None:
        t0 = time.perf_counter()
        try:
            try:
                state.pieces.append((item.rows, self._call(item, None)))
                return
            except BulkinferError:
                raise
            except Exception as exc:
                self._shrink(item.feature_idx, exc)
            isolate(item, lambda idx: self._call(item, idx), self._shrink, state)  # the rest is written
        finally:
            self.stats.add_time("infer", time.perf_counter() - t0)
            self.stats.add_figures(self.adapter.take_figures())
            self.stats.rows_inferred += len(item.rows)
            self.on_progress()

    def run(self, shards: Sequence[Shard], commit: Emit, rows: frozenset[int] | None = None) -> None:
        """Process ``shards`` (only ``rows`` of them when given: ``--retry-errors``); ``commit``
        is called (in the writer thread) with each finished shard.

        Returns normally when every shard was committed, or when ``stop`` was set (after
        committing the complete prefix of the shard in progress).
        """
        self.row_filter = rows
        self._filter_array = pa.array(sorted(rows or ()), pa.int64())
        self._halt.clear()
        q: queue.Queue[Any] = queue.Queue(maxsize=self.cfg.runtime.prefetch_batches)
        done: queue.Queue[Any] = queue.Queue(maxsize=2)
        writer_error: list[BaseException] = []
        producer = thread(self._produce, shards, q, name="bulkinfer-read")
        writer = thread(self._write_loop, done, commit, writer_error, name="bulkinfer-write")
        producer.start()
        writer.start()
        states: dict[int, ShardState] = {}
        try:
            while not writer_error:
                if self.stop.is_set():
                    for state in states.values():
                        if state.done_rows:
                            done.put(self.assembler.finish(state, partial=True))
                    break
                t0 = time.perf_counter()
                try:
                    item = q.get(timeout=0.2)
                except queue.Empty:
                    continue
                finally:
                    self.stats.wait_for_input_s += time.perf_counter() - t0
                if item is _STOP:
                    break
                if isinstance(item, Failure):
                    raise item.error
                self._handle(item, states, done)
        finally:
            self._halt.set()
            _drain(q, producer)
            done.put(_STOP)
            writer.join()
        if writer_error:
            raise writer_error[0]

    def _write_loop(self, done: queue.Queue[Any], commit: Emit, writer_error: list[BaseException]) -> None:
        """The writer thread: commit each finished shard; after a failure, drain without committing."""
        while (item := done.get()) is not _STOP:
            if writer_error:
                continue
            t0 = time.perf_counter()
            try:
                commit(item)
            except BaseException as exc:
                writer_error.append(exc)
            self.stats.add_time("write", time.perf_counter() - t0)

    def _handle(
        self, item: Batch | WindowEnd | ShardEnd, states: dict[int, ShardState], done: queue.Queue[Any]
    ) -> None:
        """One item of the reader's queue: a batch inferred, a window assembled, a shard finished."""
        key = item.shard if isinstance(item, Batch) else item.shard.index
        if key not in states:
            with self._lock:
                states[key] = ShardState(self._reading[key])
        state = states[key]
        if isinstance(item, Batch):
            self._predict(item, state)
        elif isinstance(item, WindowEnd):
            self.assembler.assemble(state, item)
        else:
            del states[key]
            with self._lock:
                self._reading.pop(key, None)
            if item.stop is not None:
                state.shard = replace(state.shard, stop=item.stop)
            if item.error is not None:
                assert item.failed_from is not None
                n = item.shard.stop - item.failed_from
                state.errors.append(ErrorRecord.of(item.shard.uri, item.failed_from, "read", item.error, rows=n))
            done.put(self.assembler.finish(state))


def _with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """Run ``fn`` in its own daemon thread; give up on it after ``timeout`` seconds.

    Python cannot kill a thread: a hung call is abandoned, not stopped, and a fresh thread
    serves the next call, so one stuck call cannot block the rest.
    """
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:
            box.append((False, exc))

    call = thread(target, name="bulkinfer-call")
    call.start()
    call.join(timeout)
    if not box:
        raise BatchTimeout(f"the model call did not return within {timeout:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _drain(q: queue.Queue[Any], producer: threading.Thread) -> None:
    """Unblock and finish the producer after the consumer stopped early."""
    while producer.is_alive():
        with contextlib.suppress(queue.Empty):
            q.get(timeout=0.05)


def _total(column: pa.Array) -> int:
    return int(pc.sum(column).as_py() or 0)
