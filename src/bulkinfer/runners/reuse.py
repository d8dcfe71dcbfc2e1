"""Results computed once: incremental runs (``--incremental-from PREVIOUS_OUT/``) and
duplicate inputs within a run (``runtime.dedupe``).

Both rest on one per-row *input hash*: a 64-bit hash of the values of the model's input
columns in that row (numbers by their float64 bits, text and bytes by BLAKE2b, nulls by a
constant), written to the output as ``_input_hash`` when ``sink.input_hash`` is on (an
incremental run always writes it, so runs chain).

**Incremental.** A row whose id is in the previous output with the same input hash takes
that output's result (read from its part, not recomputed); other rows are inferred. "The
same" also needs the same model digest and every setting that changes results (the job's
identity); otherwise nothing is reused and the run says why. The previous output's
``(id, input hash, part, row)`` are held in sorted numpy arrays: 24 bytes per previous row
(100M rows: 2.4 GB), searched with binary search per window of rows.

**Dedupe.** Within a run, a row whose input hash was seen in the same window of rows, or in
a bounded cache of recent results (``runtime.dedupe_cache_rows``), takes that result.

**The gate's rows.** The quality gate of a lowered precision runs the job's own build over its
sample rows; the first row of the run with each of those inputs takes that result
(:meth:`WindowReuse.seed`) instead of being inferred again (``report.json``
``reuse.rows_from_gate``).

:class:`WindowReuse` makes both decisions for each window a runner reads (:class:`Reuse`);
the window's assembly (:mod:`bulkinfer.runners.window`) puts the results where they belong.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..core.errors import SourceError
from ..core.hashing import id_keys, row_hashes
from ..core.layout import HASH_COLUMN
from ..finished.previous import previous_hint, schema_names

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..report import RunStats

__all__ = ["HASH_COLUMN", "DedupeCache", "PreviousOutput", "Reuse", "Slot", "WindowReuse"]

log = logging.getLogger("bulkinfer")


@dataclass(frozen=True)
class _Index:
    keys: np.ndarray  # sorted uint64 id keys
    hashes: np.ndarray  # uint64 input hash of each
    parts: np.ndarray  # int32 part index of each
    rows: np.ndarray  # int32 row in that part


class PreviousOutput:
    """The rows of an earlier output a run may take results from (read-only)."""

    def __init__(self, where: str, id_column: str) -> None:
        from ..finished.read import finished_output, part_batches

        self.where = where
        self.id_column = id_column
        self.parts, self.job = finished_output(where, "reused (--incremental-from)")
        keys, hashes, parts, rows = [], [], [], []
        for i, part in enumerate(self.parts):
            start = 0
            for batch in part_batches(part, [id_column, HASH_COLUMN], previous_hint(where)):
                keys.append(id_keys(batch.column(0)))
                hashes.append(batch.column(1).to_numpy(zero_copy_only=False).astype(np.uint64))
                parts.append(np.full(batch.num_rows, i, np.int32))
                rows.append(np.arange(start, start + batch.num_rows, dtype=np.int32))
                start += batch.num_rows
        k = np.concatenate(keys) if keys else np.empty(0, np.uint64)
        order = np.argsort(k, kind="stable")
        k = k[order]
        dup = np.flatnonzero(k[1:] == k[:-1])
        if len(dup):
            raise SourceError(
                f"{where}: ids in {id_column!r} repeat ({len(dup)} repeated); reuse needs one row per id", where
            )
        self.index = _Index(
            k,
            np.concatenate(hashes)[order] if hashes else np.empty(0, np.uint64),
            np.concatenate(parts)[order] if parts else np.empty(0, np.int32),
            np.concatenate(rows)[order] if rows else np.empty(0, np.int32),
        )
        self.rows = len(k)
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()
        cfg = self.job.get("config", {})
        kept = {id_column, HASH_COLUMN, *cfg.get("sink", {}).get("keep_columns", [])}
        self.output_columns: list[str] = [n for n in schema_names(self.parts) if n not in kept]

    def matches(self, ids: pa.ChunkedArray | pa.Array, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which rows (by id and input hash) the previous output holds unchanged, and where (index)."""
        keys = id_keys(ids)
        ix = self.index
        pos = np.searchsorted(ix.keys, keys)
        pos_ok = np.minimum(pos, max(len(ix.keys) - 1, 0))
        found = (pos < len(ix.keys)) & (ix.keys[pos_ok] == keys) if len(ix.keys) else np.zeros(len(keys), bool)
        same = found & (ix.hashes[pos_ok] == hashes) if len(ix.keys) else found
        return same, pos_ok

    def take(self, where: np.ndarray, columns: Sequence[str], ids: pa.Array | pa.ChunkedArray) -> dict[str, pa.Array]:
        """The previous output's ``columns`` at index positions ``where`` (in that order), checked
        to belong to ``ids`` (a key collision of text ids is caught, never written)."""
        ix = self.index
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        pieces: dict[str, list[pa.Array]] = {c: [] for c in columns}
        got_ids: list[pa.Array] = []
        parts = ix.parts[where]
        rows = ix.rows[where]
        order = np.argsort(parts, kind="stable")
        for p in np.unique(parts):
            sel = order[parts[order] == p]
            table = self._part(int(p), [self.id_column, *columns])
            taken = table.take(pa.array(rows[sel]))
            got_ids.append(taken.column(self.id_column).combine_chunks())
            for c in columns:
                pieces[c].append(taken.column(c).combine_chunks())
        back = np.empty(len(where), np.int64)
        back[order] = np.arange(len(where))
        out = {c: pa.concat_arrays(v).take(pa.array(back)) if v else pa.array([]) for c, v in pieces.items()}
        if got_ids:
            check = pa.concat_arrays(got_ids).take(pa.array(back))
            if not check.equals(ids.cast(check.type) if ids.type != check.type else ids):
                raise SourceError(f"{self.where}: an id key collided with another id; rerun without --incremental-from")
        return out

    def _part(self, i: int, columns: list[str]) -> pa.Table:
        import pyarrow.parquet as pq

        from ..core.storage import path_or_file

        with self._lock:
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
        table = pq.read_table(path_or_file(self.parts[i].path), columns=columns)
        with self._lock:
            self._cache[i] = table
            while len(self._cache) > 2:  # the parts of one shard's neighbourhood
                self._cache.popitem(last=False)
        return table

    def ids(self) -> np.ndarray:
        """Every previous id key (sorted)."""
        return self.index.keys


class Slot:
    """The result of one distinct input, filled when the row that computes it is assembled."""

    __slots__ = ("failed", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] | None = None
        self.failed: str | None = None


class DedupeCache:
    """Slots of recent distinct inputs by input hash, bounded in rows (least recently used go
    first). The reader claims a slot for each input it sends to the model and hands later rows
    of the same input that slot; windows are assembled in the order they were read, so the slot
    is filled (or marked failed) before any later row needs it: which rows are inferred depends
    only on the input's order, never on timing. A window keeps the slots it refers to, so
    eviction never loses a result a pending row needs."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._slots: OrderedDict[int, Slot] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, hashes: np.ndarray) -> list[Slot | None]:
        with self._lock:
            out: list[Slot | None] = []
            for h in hashes.tolist():
                slot = self._slots.get(h)
                if slot is not None:
                    self._slots.move_to_end(h)
                out.append(slot)
            return out

    def claim(self, hashes: np.ndarray) -> list[Slot]:
        """New slots for inputs about to be inferred."""
        slots = [Slot() for _ in range(len(hashes))]
        if self.max_rows <= 0:
            return slots
        with self._lock:
            for h, slot in zip(hashes.tolist(), slots, strict=True):
                self._slots[h] = slot
                self._slots.move_to_end(h)
            while len(self._slots) > self.max_rows:
                self._slots.popitem(last=False)
        return slots


@dataclass
class Reuse:
    """What a window takes from elsewhere instead of inferring it."""

    compute: np.ndarray | None = None  # positions to infer (None: all)
    reused: list[tuple[np.ndarray, dict[str, pa.Array]]] = field(default_factory=list)  # results not inferred
    dupes: tuple[np.ndarray, np.ndarray] | None = None  # positions that copy the result of other positions
    hashes: np.ndarray | None = None  # each position's input hash
    owned: tuple[np.ndarray, list[Slot]] | None = None  # positions inferred here, and the slots they fill
    deferred: tuple[np.ndarray, list[Slot]] | None = None  # positions taking an earlier window's result


class WindowReuse:
    """Decides, window by window, which rows are inferred and which take a result from the
    previous output (``--incremental-from``) or from an identical input (``runtime.dedupe``).
    One per process: a Ray worker keeps its own across the shards it runs (the previous
    output's index is loaded once, the dedupe cache is shared)."""

    def __init__(self, cfg: JobConfig, input_columns: Sequence[str]) -> None:
        self.hash_columns = list(input_columns)
        self.id_column = cfg.source.id_column or ""
        self.delta = cfg.sink.mode == "delta"  # unchanged rows are left out of the output
        self.write_hash = cfg.sink.input_hash or cfg.source.previous is not None
        self.previous_at = cfg.source.previous
        self.previous: PreviousOutput | None = None
        self.dedupe: bool | None = None if cfg.runtime.dedupe == "auto" else bool(cfg.runtime.dedupe)
        self.cache = DedupeCache(cfg.runtime.dedupe_cache_rows)
        self._seeded: dict[int, int] = {}  # input hash -> row of the gate's results, until taken
        self._seed_outputs: dict[str, pa.Array] = {}

    def seed(self, inputs: pa.Table, outputs: dict[str, pa.Array]) -> None:
        """Results already computed by this model for ``inputs`` (the quality gate's sample
        rows): the first row of the run with each of these inputs takes its result."""
        if not inputs.num_rows or any(len(col) != inputs.num_rows for col in outputs.values()):
            return
        hashes = row_hashes(inputs, self.hash_columns).tolist()
        self._seeded = {h: i for i, h in reversed(list(enumerate(hashes)))}
        self._seed_outputs = dict(outputs)

    def load_previous(self) -> None:
        """The previous output's index (``source.previous``), once."""
        if self.previous_at and self.previous is None:
            self.previous = PreviousOutput(self.previous_at, self.id_column)

    def plan(self, table: pa.Table, stats: RunStats) -> Reuse:
        """Split a window's rows into those to infer and those whose result is known: unchanged
        since the previous output, seen earlier (dedupe cache), or repeating a row of this window."""
        out = Reuse()
        if not table.num_rows:
            out.hashes = np.empty(0, dtype=np.uint64)  # a window of no rows (a split shard's empty tail)
            return out
        if not (self.write_hash or self.previous is not None or self.dedupe is not False or self._seeded):
            return out
        out.hashes = hashes = row_hashes(table, self.hash_columns)
        todo = np.arange(table.num_rows)
        if self.previous is not None:
            id_col = table.column(self.id_column)
            same, where = self.previous.matches(id_col, hashes)
            if same.any():
                pos = np.flatnonzero(same)
                stats.add_reuse(previous=len(pos))
                if not self.delta:
                    cols = self.previous.take(where[same], self.previous.output_columns, id_col.take(pa.array(pos)))
                    out.reused.append((pos, cols))
                todo = np.flatnonzero(~same)
        if self._seeded and len(todo):
            todo = self._from_gate(todo, hashes, out, stats)
        if self.dedupe is None and len(todo):  # auto: decided once, from the first rows to infer
            self.dedupe = 1 - len(np.unique(hashes[todo])) / len(todo) >= 0.02
            log.info("runtime.dedupe = auto: %s", "on" if self.dedupe else "off")
        if self.dedupe and len(todo):
            todo = self._dedupe(todo, hashes, out, stats)
        if len(todo) < table.num_rows:
            out.compute = todo
        return out

    def _from_gate(self, todo: np.ndarray, hashes: np.ndarray, out: Reuse, stats: RunStats) -> np.ndarray:
        """Rows of ``todo`` the gate computed take its results (once each: a later row with the
        same input goes on to dedupe or the model); the rest are returned."""
        keys = hashes[todo].tolist()
        hit = np.zeros(len(todo), bool)
        at: list[int] = []
        for i, h in enumerate(keys):
            row = self._seeded.pop(h, None)  # a repeat within this window finds it taken by its first row
            if row is not None:
                hit[i] = True
                at.append(row)
        if not at:
            return todo
        taken = pa.array(at, pa.int64())
        out.reused.append((todo[hit], {name: col.take(taken) for name, col in self._seed_outputs.items()}))
        stats.add_reuse(gate=len(at))
        if not self._seeded:
            self._seed_outputs = {}
        return todo[~hit]

    def _dedupe(self, todo: np.ndarray, hashes: np.ndarray, out: Reuse, stats: RunStats) -> np.ndarray:
        """Rows of ``todo`` whose input an earlier window sent to the model take that result (its
        slot, filled by the time this window is assembled); of the rest, the first row of each
        input is inferred (claiming a slot) and the others copy it."""
        slots = self.cache.lookup(hashes[todo])
        known = np.fromiter((s is not None for s in slots), bool, len(todo))
        if known.any():
            out.deferred = (todo[known], [s for s in slots if s is not None])
        todo = todo[~known]
        _, first, inverse = np.unique(hashes[todo], return_index=True, return_inverse=True)
        is_first = np.zeros(len(todo), bool)
        is_first[first] = True
        if not is_first.all():
            out.dupes = (todo[~is_first], todo[first[inverse[~is_first]]])
        stats.add_reuse(deduplicated=int(known.sum()) + len(todo) - int(is_first.sum()))
        computed = todo[is_first]
        out.owned = (computed, self.cache.claim(hashes[computed]))
        return computed
