"""Export targets' contract and the helpers they share (built by ``bulkinfer.sinks.make_target``):
systems that get each shard's rows besides the output folder (Redis,
PostgreSQL). A target is written for a shard *before* the shard's ledger line, so a crash
between the two only means the shard is exported again; every target's write is
idempotent (Redis ``SET`` of the same key, a PostgreSQL transaction that records the part
it wrote), so the replay changes nothing.

::

    start(plan, kept)     connect and check, before any inference: a target that is down is one line
    write(part, table)    the rows of one committed part (``part`` names the commit range)
    complete()            the job is complete: switch what readers see (Redis' version pointer)
    close()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError, OutputError
from ..core.layout import HASH_COLUMN

if TYPE_CHECKING:
    from ..plan import JobPlan

__all__ = [
    "ExportTarget",
    "float32_vectors",
    "id_setting",
    "is_vector",
    "retrying",
    "value_columns",
    "vector_layout",
    "vectors",
]

log = logging.getLogger("bulkinfer")

T = TypeVar("T")


class ExportTarget(Protocol):
    name: str

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None: ...

    def write(self, part: str, table: pa.Table) -> None: ...

    def complete(self) -> None: ...

    def close(self) -> None: ...


def retrying(
    fn: Callable[[], T],
    what: str,
    transient: tuple[type[BaseException], ...],
    *,
    attempts: int = 6,
    base_s: float = 0.2,
    cap_s: float = 5.0,
    on_retry: Callable[[], None] = lambda: None,
) -> T:
    """``fn()``, tried again with exponential backoff while it raises a ``transient`` error;
    after ``attempts`` tries, one :class:`OutputError` naming ``what`` and the last error."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except transient as exc:
            if attempt == attempts:
                raise OutputError(
                    f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]} (after {attempts} tries); "
                    "committed shards are kept, rerun to resume once it is back"
                ) from exc
            delay = min(cap_s, base_s * 2 ** (attempt - 1))
            log.warning("%s: %s; retrying in %.1f s (%d/%d)", what, type(exc).__name__, delay, attempt, attempts)
            time.sleep(delay)
            on_retry()
    raise AssertionError("unreachable")


def value_columns(table: pa.Table, chosen: Sequence[str], kept: Sequence[str], where: str) -> list[str]:
    """The columns a target stores: ``chosen``, else every model output column (not a kept input, nor the
    input hashes an output keeps for incremental runs)."""
    if chosen:
        missing = [c for c in chosen if c not in table.column_names]
        if missing:
            raise OutputError(
                f"{where}.columns: {missing[0]!r} is not an output column (there are {', '.join(table.column_names)})"
            )
        return list(chosen)
    return [c for c in table.column_names if c not in kept and c != HASH_COLUMN]


def is_vector(col: pa.ChunkedArray | pa.Array) -> bool:
    t = col.type
    return (pa.types.is_fixed_size_list(t) or pa.types.is_list(t)) and pa.types.is_floating(t.value_type)


def vectors(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A vector column as a float32 matrix (one row per value)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_fixed_size_list(arr.type):
        flat = arr.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(arr), arr.type.list_size).astype(np.float32, copy=False)
    return np.asarray(arr.to_pylist(), dtype=np.float32)


def vector_layout(
    table: pa.Table, vector: str, chosen: Sequence[str], kept: Sequence[str], where: str
) -> tuple[str, list[str]]:
    """What a vector database stores of each row besides its id: the vector column (``vector``,
    else the output's one vector column) and the scalar columns (``chosen``, else every other
    model output column that is not a vector)."""
    if vector:
        if vector not in table.column_names or not is_vector(table.column(vector)):
            found = [c for c in table.column_names if is_vector(table.column(c))]
            raise OutputError(f"{where}.vector: {vector!r} is not a vector column of the output (vectors: {found})")
    else:
        found = [c for c in value_columns(table, (), kept, where) if is_vector(table.column(c))]
        if len(found) != 1:
            raise OutputError(
                f"{where}.vector: the output has {len(found)} vector columns ({', '.join(found) or 'none'}); "
                "name the one to store"
            )
        vector = found[0]
    scalars = [c for c in value_columns(table, chosen, kept, where) if c != vector]
    if not chosen:
        scalars = [c for c in scalars if not is_vector(table.column(c))]
    return vector, scalars


def id_setting(plan: JobPlan, where: str) -> str:
    """The id column a keyed target (a vector database, a feature store) keys its rows by:
    ``source.id_column``, required."""
    id_column = plan.config.get("source", {}).get("id_column")
    if not id_column:
        raise ConfigError(f"{where}: this target keys rows by id; set source.id_column")
    return str(id_column)


def float32_vectors(col: pa.ChunkedArray | pa.Array) -> pa.FixedSizeListArray:
    """A vector column as Arrow fixed-size lists of float32 (what vector databases take)."""
    m = vectors(col)
    return pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), m.shape[1])
