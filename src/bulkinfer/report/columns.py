"""Statistics of the output's columns, computed while each part is staged and merged across
parts, Ray workers and runs: count, nulls, NaN/inf, mean, std, min/max and quantiles (an
Apache DataSketches KLL sketch: mergeable, no sorting) for numbers; the class histogram
for labels; the norm's distribution and the mean vector for vectors.

Every figure but the quantiles is exact (means and standard deviations up to float
rounding, merged with Chan's parallel formula). Quantiles carry the KLL sketch's rank
error (about 1.3% at k=200, 99% confidence); under 200 values they are exact.

A part's statistics travel as a JSON-able *state* (sketches base64-encoded), so a Ray
worker can hand them to the driver and ``_bulkinfer/stats.json`` can keep them for a resume.
"""

from __future__ import annotations

import base64
import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "KLL_K",
    "MAX_CLASSES",
    "QUANTILES",
    "OutputStats",
    "column_kind",
    "describe",
    "distribution",
    "merge_distribution",
    "merge_moments",
    "moments",
    "sketch_of",
    "summary",
    "vector_of",
]

KLL_K = 200
MAX_CLASSES = 256  # a label column with more distinct values keeps no histogram
QUANTILES = {"p1": 0.01, "p5": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95, "p99": 0.99}


def _sketch(state: str | None = None) -> Any:
    from datasketches import kll_doubles_sketch

    return kll_doubles_sketch.deserialize(base64.b64decode(state)) if state else kll_doubles_sketch(KLL_K)


def column_kind(t: pa.DataType) -> str:
    """``number``, ``label`` (integers too: a class id is an integer), ``vector`` or ``other``."""
    if pa.types.is_dictionary(t):
        return "label"
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return "label"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if (pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)
    ):
        return "vector"
    return "other"


# -- moments: (n, mean, M2, min, max), merged exactly (Chan et al.) ----------------------
def moments(values: np.ndarray) -> dict[str, Any]:
    """Count, mean, M2, min and max of finite ``values``, mergeable exactly (:func:`merge_moments`)."""
    if not len(values):
        return {"n": 0, "mean": 0.0, "m2": 0.0, "min": None, "max": None}
    mean = float(values.mean())
    return {
        "n": len(values),
        "mean": mean,
        "m2": float(((values - mean) ** 2).sum()),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def merge_moments(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    if not b["n"]:
        return dict(a)
    if not a["n"]:
        return dict(b)
    n = a["n"] + b["n"]
    delta = b["mean"] - a["mean"]
    return {
        "n": n,
        "mean": a["mean"] + delta * b["n"] / n,
        "m2": a["m2"] + b["m2"] + delta * delta * a["n"] * b["n"] / n,
        "min": min(a["min"], b["min"]),
        "max": max(a["max"], b["max"]),
    }


def distribution(values: np.ndarray) -> dict[str, Any]:
    """Moments and a KLL sketch of finite values (a mergeable state: :func:`merge_distribution`)."""
    sk = _sketch()
    if len(values):
        sk.update(values)
    return {"moments": moments(values), "sketch": base64.b64encode(sk.serialize()).decode()}


def merge_distribution(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    sk = _sketch(a["sketch"])
    sk.merge(_sketch(b["sketch"]))
    return {"moments": merge_moments(a["moments"], b["moments"]), "sketch": base64.b64encode(sk.serialize()).decode()}


def summary(dist: Mapping[str, Any]) -> dict[str, Any]:
    m = dist["moments"]
    out: dict[str, Any] = {
        "mean": m["mean"] if m["n"] else None,
        "std": math.sqrt(m["m2"] / m["n"]) if m["n"] else None,
        "min": m["min"],
        "max": m["max"],
    }
    sk = _sketch(dist["sketch"])
    out["quantiles"] = (
        {name: float(sk.get_quantile(q, inclusive=True)) for name, q in QUANTILES.items()}
        if not sk.is_empty()
        else None
    )
    return out


# -- per kind ------------------------------------------------------------------------------
def _finite(values: np.ndarray) -> tuple[np.ndarray, int, int]:
    nan = int(np.isnan(values).sum())
    inf = int(np.isinf(values).sum())
    return (values[np.isfinite(values)] if nan or inf else values), nan, inf


def _histogram(col: pa.ChunkedArray) -> dict[str, int] | None:
    counts = pc.value_counts(col.drop_null()).to_pylist() if len(col) else []
    if len(counts) > MAX_CLASSES:
        return None
    return {_label(c["values"]): int(c["counts"]) for c in counts}


def _label(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _describe_column(col: pa.ChunkedArray) -> dict[str, Any]:
    kind = column_kind(col.type)
    nulls = int(col.null_count)
    state: dict[str, Any] = {"kind": kind, "count": len(col), "nulls": nulls}
    if kind == "label" and pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if kind == "label":
        state["classes"] = _histogram(col)
        if pa.types.is_integer(col.type):
            state["values"] = distribution(col.drop_null().to_numpy().astype(np.float64))
    elif kind == "number":
        values, state["nan"], state["inf"] = _finite(col.drop_null().to_numpy(zero_copy_only=False).astype(np.float64))
        state["values"] = distribution(values)
    elif kind == "vector":
        state.update(_describe_vectors(col))
    return state


def _describe_vectors(col: pa.ChunkedArray) -> dict[str, Any]:
    present = col.drop_null()
    out: dict[str, Any] = {"dim": None, "nonfinite": 0, "sum": None}
    if not len(present):
        out["norm"] = distribution(np.empty(0))
        return out
    arr = present.combine_chunks()
    sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    if sizes.min() == sizes.max() and sizes[0] > 0:  # one dimension: a matrix
        mat = flat.reshape(len(sizes), int(sizes[0]))
        finite = np.isfinite(mat).all(axis=1)
        out["dim"] = int(sizes[0])
        out["nonfinite"] = int((~finite).sum())
        good = mat[finite]
        out["sum"] = base64.b64encode(good.sum(axis=0).astype("<f8").tobytes()).decode()
        out["norm"] = distribution(np.linalg.norm(good, axis=1))
        return out
    norms, nonfinite = [], 0  # ragged lists: no mean vector
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for lo, hi in itertools.pairwise(offsets):
        v = flat[lo:hi]
        if np.isfinite(v).all():
            norms.append(float(np.linalg.norm(v)))
        else:
            nonfinite += 1
    out["nonfinite"] = nonfinite
    out["dim"] = -1  # several dimensions
    out["norm"] = distribution(np.asarray(norms, np.float64))
    return out


def _merge_column(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    if a["kind"] != b["kind"]:
        return {"kind": "other", "count": a["count"] + b["count"], "nulls": a["nulls"] + b["nulls"]}
    out: dict[str, Any] = {"kind": a["kind"], "count": a["count"] + b["count"], "nulls": a["nulls"] + b["nulls"]}
    for key in ("nan", "inf", "nonfinite"):
        if key in a:
            out[key] = a[key] + b.get(key, 0)
    if "classes" in a:
        ca, cb = a["classes"], b.get("classes")
        if ca is None or cb is None:
            out["classes"] = None
        else:
            merged = dict(ca)
            for k, v in cb.items():
                merged[k] = merged.get(k, 0) + v
            out["classes"] = merged if len(merged) <= MAX_CLASSES else None
    for key in ("values", "norm"):
        if key in a and key in b:
            out[key] = merge_distribution(a[key], b[key])
    if a["kind"] == "vector":
        out["dim"] = a["dim"] if a["dim"] == b["dim"] or b["dim"] is None else (b["dim"] if a["dim"] is None else -1)
        if out["dim"] not in (None, -1) and (a["sum"] or b["sum"]):
            sa = vector_of(a["sum"]) if a["sum"] else 0.0
            sb = vector_of(b["sum"]) if b["sum"] else 0.0
            out["sum"] = base64.b64encode(np.asarray(sa + sb, "<f8").tobytes()).decode()
        else:
            out["sum"] = None
    return out


def vector_of(b64: str) -> np.ndarray:
    """A vector kept base64-encoded in a state (a vector column's sum)."""
    return np.frombuffer(base64.b64decode(b64), "<f8")


def sketch_of(dist: Mapping[str, Any]) -> Any:
    """The KLL sketch of a distribution's state."""
    return _sketch(dist["sketch"])


def _column_summary(state: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: state[k] for k in ("kind", "count", "nulls", "nan", "inf", "nonfinite") if k in state}
    if "classes" in state:
        classes = state["classes"]
        out["classes"] = None if classes is None else dict(sorted(classes.items(), key=lambda kv: (-kv[1], kv[0])))
        if classes is None:
            out["classes_note"] = f"over {MAX_CLASSES} distinct values: no histogram"
    if "values" in state:
        out.update(summary(state["values"]))
    if state["kind"] == "vector":
        out["dim"] = state["dim"]
        out["norm"] = summary(state["norm"])
        n = state["norm"]["moments"]["n"]
        out["mean_vector"] = [round(float(x), 6) for x in vector_of(state["sum"]) / n] if state["sum"] and n else None
    return out


class OutputStats:
    """The merged statistics of a set of parts (which ones: ``covers``)."""

    def __init__(
        self,
        columns: Mapping[str, Any] | None = None,
        covers: Iterable[str] = (),
        rows: int = 0,
        schema: Mapping[str, str] | None = None,
    ) -> None:
        self.columns: dict[str, Any] = dict(columns or {})
        self.covers: set[str] = set(covers)
        self.rows = rows
        self.schema: dict[str, str] = dict(schema or {})  # every column of the parts (passthrough too) -> type

    def add(self, part: str, state: Mapping[str, Any] | None) -> None:
        """Merge one part's state (from :func:`describe`); a part already covered is not counted twice."""
        if state is None or part in self.covers:
            return
        self.covers.add(part)
        self.rows += int(state["rows"])
        self.schema = self.schema or dict(state.get("schema", {}))
        for name, col in state["columns"].items():
            self.columns[name] = _merge_column(self.columns[name], col) if name in self.columns else dict(col)

    def to_json(self) -> dict[str, Any]:
        """What ``_bulkinfer/stats.json`` holds: the figures, and the state to merge more parts into."""
        return {
            "version": 1,
            "rows": self.rows,
            "schema": self.schema,
            "columns": {name: _column_summary(s) for name, s in sorted(self.columns.items())},
            "state": {"covers": sorted(self.covers), "columns": self.columns},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputStats:
        state = data["state"]
        return cls(state["columns"], state["covers"], int(data["rows"]), data.get("schema"))


def describe(table: pa.Table, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The statistics state of one part's rows (``skip``: passthrough columns such as the id)."""
    skipped = set(skip)
    return {
        "rows": table.num_rows,
        "schema": {f.name: str(f.type) for f in table.schema},
        "columns": {name: _describe_column(table.column(name)) for name in table.column_names if name not in skipped},
    }
