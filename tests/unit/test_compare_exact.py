"""``bulkinfer compare``'s quantiles, KS and PSI are exact up to EXACT_ROWS compared rows and,
beyond, taken over the rows whose ids hash lowest: identical inputs give identical figures in
any order (a KLL sketch's random compaction once gave cosine p1 0.998385, then 0.998446)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from bulkinfer.outputs.compare_columns import HashSample, Numbers, Vectors, ks, quantiles


def _vectors(rng: np.random.Generator, n: int) -> tuple[pa.Array, pa.Array]:
    old = rng.normal(size=(n, 8))
    new = old + rng.normal(scale=0.05, size=(n, 8))
    return (pa.array(list(old), pa.list_(pa.float64())), pa.array(list(new), pa.list_(pa.float64())))


def test_cosine_quantiles_are_exact_and_the_same_in_any_order():
    rng = np.random.default_rng(7)
    old, new = _vectors(rng, 5000)
    h = rng.permutation(5000).astype(np.uint64) * 7919
    cos = np.einsum("ij,ij->i", *(np.stack(x.to_numpy(zero_copy_only=False)) for x in (old, new)))
    cos /= np.linalg.norm(np.stack(old.to_numpy(zero_copy_only=False)), axis=1)
    cos /= np.linalg.norm(np.stack(new.to_numpy(zero_copy_only=False)), axis=1)
    got = []
    for order in (np.arange(10), np.arange(10)[::-1]):
        v = Vectors()
        for i in order:
            part = slice(i * 500, (i + 1) * 500)
            v.add(pa.chunked_array([old[part]]), pa.chunked_array([new[part]]), h[part], 5)
        got.append(quantiles(v.sample.column()))
    assert got[0] == got[1]
    assert got[0]["p1"] == np.quantile(cos, 0.01, method="inverted_cdf")  # exact: every row kept


def test_ks_and_psi_of_numbers_are_exact():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=4000), rng.normal(0.1, 1.2, size=4000)
    n = Numbers()
    n.add(pa.chunked_array([a]), pa.chunked_array([b]), np.arange(4000, dtype=np.uint64))
    fig = n.figures()
    assert fig["ks"] == stats.ks_2samp(a, b).statistic
    assert fig["quantiles_old"]["p50"] == np.quantile(a, 0.5, method="inverted_cdf") and fig["psi"] > 0
    assert ks(a, a) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**63), min_size=1, max_size=300, unique=True), st.integers(1, 40),
       st.randoms(use_true_random=False))  # fmt: skip
def test_a_hash_sample_keeps_the_lowest_hashes_whatever_the_batches(hashes, limit, rnd):
    h = np.asarray(hashes, np.uint64)
    order = list(range(len(h)))
    rnd.shuffle(order)
    sample = HashSample(limit=limit)
    cuts = sorted(rnd.sample(range(1, len(h)), min(5, len(h) - 1))) if len(h) > 1 else []
    for part in np.split(np.asarray(order), cuts):
        sample.add(h[part], h[part].astype(np.float64))
    kept = sorted(sample.column())
    assert kept == sorted(np.sort(h)[:limit].astype(np.float64))
