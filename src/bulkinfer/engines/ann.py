"""Approximate nearest neighbours as an engine: Faiss (loaded lazily), an index's provenance
file (``<index>.json``) and the check that turns a vector column into a float32 matrix.
Used by ``bulkinfer index`` (which builds) and the kNN adapter (which searches)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.errors import ConfigError, SourceError

__all__ = ["load_faiss", "load_index_meta", "valid_vectors"]


def load_faiss() -> Any:
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it loaded: not news
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - a dev extra
        raise ConfigError("bulkinfer index needs Faiss: pip install 'bulkinfer[index]' (faiss-cpu)") from exc
    return faiss


def load_index_meta(path: str | Path) -> dict[str, Any]:
    """``<index>.json``: what an index was built from and how (one line if it is missing)."""
    meta = Path(f"{path}.json")
    if not Path(path).is_file() or not meta.is_file():
        raise ConfigError(f"{path}: no index there (an index is the file and its .json, written by bulkinfer index)")
    return dict(json.loads(meta.read_text()))


def valid_vectors(col: pa.Array, dim: int | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The rows that are valid vectors of ``dim`` (the first one's when None), as float32,
    their offsets in ``col``, and a reason for each row that is not (None for valid ones)."""
    if not (pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type)):
        raise SourceError(f"the column is {col.type}, not a vector (a list of floats)", "")
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if len(col) and not col.null_count and not col.values.null_count:  # the usual case, without Python
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        width = dim if dim is not None else int(lengths[0])
        if (lengths == width).all():
            flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            mat = flat.reshape(len(col), width)
            finite = np.isfinite(mat).all(axis=1)
            if finite.all():
                return mat, np.arange(len(col), dtype=np.int64), [""] * len(col)
    values = col.to_pylist()
    keep, rows, reasons = [], [], []
    for i, v in enumerate(values):
        reason = ""
        if v is None:
            reason = "the vector is null"
        else:
            if dim is None:
                dim = len(v)
            if len(v) != dim:
                reason = f"the vector has {len(v)} dimensions, the others {dim}"
            elif any(x is None for x in v) or not all(math.isfinite(x) for x in v):
                reason = "the vector holds NaN, infinity or null"
        reasons.append(reason)
        if not reason:
            keep.append(i)
            rows.append(v)
    mat = np.asarray(rows, dtype=np.float32).reshape(len(rows), dim or 0)
    return mat, np.asarray(keep, dtype=np.int64), reasons
