"""64-bit hashes of column values, vectorised: a row's *input hash* (numbers by their float64
bits through splitmix64, text and bytes by BLAKE2b, nulls by a constant) and an id's key. The
reuse of an incremental run, dedupe, the deleted ids and ``bulkinfer compare``'s row pairing
all go by these."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["id_keys", "row_hashes", "splitmix64"]

_NULL = np.uint64(0x6A09E667F3BCC908)
_M = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 of 64-bit values: a well-spread hash of integers, vectorised."""
    with np.errstate(over="ignore"):
        return _mix(x.astype(np.uint64) + _M)


def _blake(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), np.uint64)
    for i, v in enumerate(values):
        if v is None:
            out[i] = _NULL
            continue
        data = v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogatepass")
        out[i] = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    return out


def _column_hash(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        values = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
        bits = np.ascontiguousarray(np.where(values == 0, 0.0, values)).view(np.uint64)  # -0.0 == 0.0
        h = splitmix64(bits)
        if arr.null_count:
            h = np.where(arr.is_null().to_numpy(zero_copy_only=False), _NULL, h)
        return h
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_struct(t):
        import json

        return _blake([None if v is None else json.dumps(v, sort_keys=True) for v in arr.to_pylist()])
    return _blake(arr.to_pylist())


def row_hashes(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """One 64-bit hash per row of the values in ``columns`` (in that order)."""
    h = np.full(table.num_rows, np.uint64(len(columns)), np.uint64)
    with np.errstate(over="ignore"):
        for name in columns:
            h = _mix(h * _M + _column_hash(table.column(name)))
    return h


def id_keys(ids: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A 64-bit key per id: integers as themselves, anything else by BLAKE2b of its text."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if pa.types.is_integer(arr.type) and arr.null_count == 0:
        return arr.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    return _blake(arr.to_pylist())
