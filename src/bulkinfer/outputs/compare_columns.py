"""The per-kind accumulators of ``bulkinfer compare``: each takes the joined rows of one
column, batch by batch, and keeps what its figures need (vectors: cosine; top-K lists:
overlap; labels: agreement and the confusion; numbers: differences and the two
distributions), never the column whole.

Quantiles, KS and PSI come from a :class:`HashSample`: every compared row's value up to
``EXACT_ROWS`` rows (the figures are then exact), beyond that the values of the rows whose id
hashes lowest. Either way identical outputs give identical figures, run after run, which a
``--fail-if`` gate needs (a KLL sketch's random compaction made p1 differ in the fourth digit).
Means, minima and the absolute change are over every row."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..report.columns import MAX_CLASSES, QUANTILES, merge_moments, moments
from ..report.drift import DECILES, psi

__all__ = [
    "EXACT_ROWS", "HashSample", "Labels", "Numbers", "TopK", "Vectors", "ks", "matrix", "mean_of", "quantiles", "unit",
]  # fmt: skip

EXACT_ROWS = 1_000_000
"""Compared rows kept for quantiles, KS and PSI (8 bytes a value): exact up to this many."""


def matrix(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Rows as a float64 matrix and which rows are valid (present, one dimension, finite)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
    if not valid.any():
        return np.zeros((n, 0)), valid
    sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    dim = int(sizes[valid][0])
    valid &= np.nan_to_num(sizes, nan=-1).astype(np.int64) == dim
    mat = np.zeros((n, dim))
    if valid.any():
        mat[valid] = pc.list_flatten(arr.filter(pa.array(valid))).to_numpy(zero_copy_only=False).reshape(-1, dim)
    valid &= np.isfinite(mat).all(axis=1)
    return mat, valid


def unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)


class HashSample:
    """The values (``width`` per row) of at most ``limit`` rows: those whose id hashes lowest,
    so the same rows whatever order the buckets come in."""

    def __init__(self, width: int = 1, limit: int = EXACT_ROWS) -> None:
        self.limit = limit
        self.hashes = np.empty(0, np.uint64)
        self.values = np.empty((0, width))

    def add(self, hashes: np.ndarray, values: np.ndarray) -> None:
        self.hashes = np.concatenate([self.hashes, hashes.astype(np.uint64)])
        self.values = np.concatenate([self.values, values.reshape(len(hashes), -1)])
        if len(self.hashes) > 2 * self.limit:  # trimmed now and then, not at every batch
            self._trim()

    def _trim(self) -> None:
        if len(self.hashes) > self.limit:
            keep = np.argsort(self.hashes, kind="stable")[: self.limit]
            self.hashes, self.values = self.hashes[keep], self.values[keep]

    def column(self, i: int = 0) -> np.ndarray:
        """The kept rows' ``i``-th values, the finite ones."""
        self._trim()
        v = self.values[:, i]
        return v[np.isfinite(v)]


def quantiles(values: np.ndarray) -> dict[str, float] | None:
    """p1 ... p99 as values of the sample (the lower one at a tie, as a sketch's inclusive rank)."""
    if not len(values):
        return None
    return {name: float(np.quantile(values, q, method="inverted_cdf")) for name, q in QUANTILES.items()}


def _merged(total: dict[str, Any] | None, values: np.ndarray) -> dict[str, Any]:
    """``total``'s moments with ``values``' (None: ``values``' alone)."""
    part = moments(values)
    return part if total is None else merge_moments(total, part)


def mean_of(m: dict[str, Any] | None) -> float | None:
    """The mean ``moments`` hold (None: no value)."""
    return float(m["mean"]) if m is not None and m["n"] else None


class Vectors:
    def __init__(self) -> None:
        self.cos: dict[str, Any] | None = None  # the cosines' moments (their quantiles: ``sample``)
        self.sample = HashSample()
        self.dims: tuple[int, int] | None = None
        self.invalid = 0
        self.queries: list[tuple[int, np.ndarray, np.ndarray]] = []  # (hash, old unit, new unit)

    def add(self, old: pa.ChunkedArray, new: pa.ChunkedArray, h: np.ndarray, n_queries: int) -> None:
        mo, vo = matrix(old)
        mn, vn = matrix(new)
        both = vo & vn
        self.invalid += int((~both).sum())
        if not both.any():
            return
        self.dims = self.dims or (mo.shape[1], mn.shape[1])
        uo, un = unit(mo[both]), unit(mn[both])
        hb = h[both]
        if uo.shape[1] == un.shape[1]:
            values = np.einsum("ij,ij->i", uo, un)
            self.cos = _merged(self.cos, values)
            self.sample.add(hb, values)
        for i in np.argsort(hb)[:n_queries]:
            self.queries.append((int(hb[i]), uo[i], un[i]))
        self.queries = sorted(self.queries, key=lambda q: q[0])[:n_queries]


class TopK:
    """Running top-K neighbours of the queries in one space (ids are the rows' hashes)."""

    def __init__(self, q: np.ndarray, q_ids: np.ndarray, k: int) -> None:
        self.q, self.q_ids, self.k = q, q_ids, k
        self.scores = np.full((len(q), 0), -np.inf)
        self.ids = np.zeros((len(q), 0), np.uint64)

    def add(self, m: np.ndarray, ids: np.ndarray) -> None:
        if not len(ids):
            return
        sims = self.q @ m.T
        sims[self.q_ids[:, None] == ids[None, :]] = -np.inf  # a row is not its own neighbour
        scores = np.concatenate([self.scores, sims], axis=1)
        all_ids = np.concatenate([self.ids, np.broadcast_to(ids, (len(self.q), len(ids)))], axis=1)
        keep = min(self.k, scores.shape[1])
        top = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
        self.scores = np.take_along_axis(scores, top, axis=1)
        self.ids = np.take_along_axis(all_ids, top, axis=1)

    def neighbour_sets(self) -> list[set[int]]:
        return [
            {int(i) for i, s in zip(ids, sc, strict=True) if s > -np.inf}
            for ids, sc in zip(self.ids, self.scores, strict=True)
        ]


class Labels:
    def __init__(self) -> None:
        self.agree = 0
        self.n = 0
        self.confusion: Counter[tuple[str, str]] | None = Counter()

    def add(self, old: pa.ChunkedArray, new: pa.ChunkedArray) -> None:
        a = ["null" if v is None else _text(v) for v in old.to_pylist()]
        b = ["null" if v is None else _text(v) for v in new.to_pylist()]
        self.n += len(a)
        self.agree += sum(x == y for x, y in zip(a, b, strict=True))
        if self.confusion is not None:
            self.confusion.update(zip(a, b, strict=True))
            if len({k for pair in self.confusion for k in pair}) > MAX_CLASSES:
                self.confusion = None

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "label", "agreement": self.agree / self.n if self.n else None}
        if self.confusion is None:
            out["confusion_note"] = f"over {MAX_CLASSES} classes: no confusion matrix"
            return out
        classes = sorted({k for pair in self.confusion for k in pair})
        out["classes"] = classes
        out["confusion"] = {o: {n: self.confusion.get((o, n), 0) for n in classes} for o in classes}
        out["flips"] = {
            c: {
                "left": sum(v for (o, n), v in self.confusion.items() if o == c and n != c),
                "joined": sum(v for (o, n), v in self.confusion.items() if n == c and o != c),
            }
            for c in classes
        }
        return out


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


class Numbers:
    def __init__(self) -> None:
        self.old: dict[str, Any] | None = None  # each side's moments (quantiles, KS, PSI: ``sample``)
        self.new: dict[str, Any] | None = None
        self.abs_diff = 0.0
        self.paired = 0
        self.sample = HashSample(width=2)

    def add(self, old: pa.ChunkedArray, new: pa.ChunkedArray, h: np.ndarray) -> None:
        a = old.to_numpy(zero_copy_only=False).astype(np.float64)
        b = new.to_numpy(zero_copy_only=False).astype(np.float64)
        self.old, self.new = _merged(self.old, a[np.isfinite(a)]), _merged(self.new, b[np.isfinite(b)])
        both = np.isfinite(a) & np.isfinite(b)
        self.abs_diff += float(np.abs(a[both] - b[both]).sum())
        self.paired += int(both.sum())
        self.sample.add(h, np.stack([a, b], axis=1))

    def figures(self) -> dict[str, Any]:
        if self.old is None or self.new is None:
            return {"kind": "number", "mean_shift": None, "mean_abs_diff": None, "ks": None, "psi": None}
        mean_old, mean_new = mean_of(self.old), mean_of(self.new)
        shift = None if mean_old is None or mean_new is None else mean_new - mean_old
        a, b = self.sample.column(0), self.sample.column(1)
        return {
            "kind": "number",
            "mean_old": mean_old,
            "mean_new": mean_new,
            "mean_shift": shift,
            "mean_abs_diff": self.abs_diff / self.paired if self.paired else None,
            "ks": ks(a, b),
            "psi": _psi(a, b),
            "quantiles_old": quantiles(a),
            "quantiles_new": quantiles(b),
        }


def ks(a: np.ndarray, b: np.ndarray) -> float | None:
    """The two-sample Kolmogorov-Smirnov statistic, max |F_a(x) - F_b(x)| over every value."""
    if not len(a) or not len(b):
        return None
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    fa = np.searchsorted(a, points, side="right") / len(a)
    fb = np.searchsorted(b, points, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def _psi(old: np.ndarray, new: np.ndarray) -> float | None:
    """PSI of the new values against the old over the old values' deciles."""
    if not len(old) or not len(new):
        return None
    edges = np.unique(np.quantile(old, DECILES, method="inverted_cdf"))
    a, b = (np.bincount(np.searchsorted(edges, v, side="left"), minlength=len(edges) + 1) / len(v) for v in (old, new))
    return psi(list(a), list(b))
