"""Column statistics: merged across any split into parts, they equal the whole's (exactly for
counts, histograms, extremes; to float rounding for moments; within the KLL sketch's stated
rank error for quantiles). Drift figures against a brute-force PSI."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.report.columns import QUANTILES, OutputStats, describe
from bulkinfer.report.drift import compare_stats, psi

RANK_EPS = 2 * 0.0133  # twice KLL's normalised rank error at k=200 (99% confidence): never flaky


def rank_ok(values: np.ndarray, reported: float, q: float) -> bool:
    """``reported`` is a ``q``-quantile of ``values`` up to the rank error (ties widen the range)."""
    lo, hi = float((values < reported).mean()), float((values <= reported).mean())
    return lo - RANK_EPS <= q <= hi + RANK_EPS


def merged(table: pa.Table, cuts: list[int], skip: tuple[str, ...] = ()) -> OutputStats:
    out = OutputStats()
    bounds = [0, *sorted(set(cuts)), table.num_rows]
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi > lo:
            out.add(f"part-{i}", describe(table.slice(lo, hi - lo), skip))
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3000),
    cuts=st.lists(st.integers(0, 3000), max_size=8),
    seed=st.integers(0, 2**16),
    bad=st.floats(0, 0.2),
)
def test_number_and_label_stats_merge_to_the_whole(n, cuts, seed, bad):
    rng = np.random.default_rng(seed)
    x = rng.normal(3.0, 2.0, size=n)
    x[rng.random(n) < bad] = np.nan
    x[rng.random(n) < bad / 4] = np.inf
    null = rng.random(n) < bad
    labels = rng.choice(["cat", "dog", "eel"], size=n, p=[0.6, 0.3, 0.1])
    ints = rng.integers(0, 4, size=n)
    table = pa.table(
        {
            "id": np.arange(n),
            "score": pa.array(x, mask=null),
            "label": pa.array(labels, mask=rng.random(n) < bad),
            "cls": ints,
        }
    )
    stats = merged(table, [c for c in cuts if c < n], skip=("id",)).to_json()
    assert stats["rows"] == n and set(stats["columns"]) == {"score", "label", "cls"}

    s = stats["columns"]["score"]
    present = x[~null]
    finite = present[np.isfinite(present)]
    assert (s["count"], s["nulls"]) == (n, int(null.sum()))
    assert (s["nan"], s["inf"]) == (int(np.isnan(present).sum()), int(np.isinf(present).sum()))
    if len(finite):
        assert (s["min"], s["max"]) == (finite.min(), finite.max())
        assert math.isclose(s["mean"], finite.mean(), rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(s["std"], finite.std(), rel_tol=1e-7, abs_tol=1e-9)
        for name, q in QUANTILES.items():
            assert rank_ok(finite, s["quantiles"][name], q), (name, s["quantiles"][name])
    else:
        assert s["mean"] is None and s["quantiles"] is None

    lab = stats["columns"]["label"]
    expect = {}
    for v, m in zip(labels, table["label"].is_null().to_pylist(), strict=True):
        if not m:
            expect[str(v)] = expect.get(str(v), 0) + 1
    assert lab["kind"] == "label" and lab["classes"] == dict(sorted(expect.items(), key=lambda kv: (-kv[1], kv[0])))
    cls = stats["columns"]["cls"]
    assert cls["classes"] == {str(k): int((ints == k).sum()) for k in np.unique(ints)} | {}
    assert math.isclose(cls["mean"], ints.mean(), rel_tol=1e-9)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 800), dim=st.integers(1, 24), cuts=st.lists(st.integers(0, 800), max_size=5),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_vector_stats_merge_to_the_whole(n, dim, cuts, seed):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(n, dim))
    bad = rng.random(n) < 0.05
    m[bad, 0] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(m.ravel(), pa.float32()), dim)
    stats = merged(pa.table({"embedding": col}), [c for c in cuts if c < n]).to_json()["columns"]["embedding"]
    good = m[~bad].astype(np.float32).astype(np.float64)
    assert (stats["kind"], stats["dim"], stats["count"], stats["nonfinite"]) == ("vector", dim, n, int(bad.sum()))
    if len(good):
        np.testing.assert_allclose(stats["mean_vector"], good.mean(axis=0), atol=2e-6)
        norms = np.linalg.norm(good, axis=1)
        assert math.isclose(stats["norm"]["mean"], norms.mean(), rel_tol=1e-9)
        assert (stats["norm"]["min"], stats["norm"]["max"]) == pytest.approx((norms.min(), norms.max()))
        assert rank_ok(norms, stats["norm"]["quantiles"]["p50"], 0.5)


def test_a_part_is_counted_once_and_histograms_over_the_cap_are_dropped():
    t = pa.table({"v": [1.0, 2.0, 3.0], "name": ["a", "b", "a"]})
    out = OutputStats()
    out.add("p0", describe(t))
    out.add("p0", describe(t))  # the same part again (a resume that reads stats.json and the part)
    assert out.rows == 3 and out.to_json()["columns"]["name"]["classes"] == {"a": 2, "b": 1}
    many = pa.table({"name": [f"n{i}" for i in range(300)]})
    out.add("p1", describe(many))
    col = out.to_json()["columns"]["name"]
    assert col["classes"] is None and "over 256" in col["classes_note"]
    again = OutputStats.from_json(out.to_json())
    assert again.rows == 303 and again.covers == {"p0", "p1"}


def brute_psi(base: np.ndarray, cur: np.ndarray) -> float:
    edges = np.unique(np.quantile(base, [i / 10 for i in range(1, 10)], method="inverted_cdf"))
    b = np.diff([0.0, *[(base <= e).mean() for e in edges], 1.0])  # bins (e_i, e_i+1]
    c = np.diff([0.0, *[(cur <= e).mean() for e in edges], 1.0])
    b, c = np.maximum(b, 1e-4), np.maximum(c, 1e-4)
    return float(((c - b) * np.log(c / b)).sum())


def test_drift_psi_against_brute_force_and_the_status():
    rng = np.random.default_rng(3)
    base = rng.normal(size=150)  # under k values: the sketches are exact, so is the PSI
    same = rng.normal(size=150)
    moved = rng.normal(1.0, 1.0, size=150)
    b = OutputStats()
    b.add("p", describe(pa.table({"s": base, "c": ["x"] * 100 + ["y"] * 50})))
    near, far = OutputStats(), OutputStats()
    near.add("p", describe(pa.table({"s": same, "c": ["x"] * 98 + ["y"] * 52})))
    far.add("p", describe(pa.table({"s": moved, "c": ["x"] * 30 + ["y"] * 100 + ["z"] * 20})))
    ok = compare_stats(b, near, max_psi=0.25)
    assert ok["status"] == "ok" and ok["over"] == []
    assert ok["columns"]["s"]["psi"] == pytest.approx(brute_psi(base, same), abs=1e-6)
    bad = compare_stats(b, far, max_psi=0.25)
    assert bad["status"] == "drift" and bad["over"] == ["c", "s"]
    assert bad["columns"]["s"]["psi"] == pytest.approx(brute_psi(base, moved), abs=1e-6)
    assert bad["columns"]["s"]["mean_shift"] == pytest.approx(moved.mean() - base.mean(), abs=1e-6)
    c = bad["columns"]["c"]
    assert c["psi"] == pytest.approx(psi([100 / 150, 50 / 150, 0], [30 / 150, 100 / 150, 20 / 150]), abs=1e-6)
    assert c["new_classes"] == ["z"] and c["share_change"]["x"] == pytest.approx(30 / 150 - 100 / 150, abs=1e-6)


def test_vector_drift_reports_the_norm_and_the_mean_direction():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(120, 8)) + 3.0
    b = -a
    col = lambda m: pa.FixedSizeListArray.from_arrays(pa.array(m.ravel()), 8)  # noqa: E731
    sa, sb = OutputStats(), OutputStats()
    sa.add("p", describe(pa.table({"e": col(a)})))
    sb.add("p", describe(pa.table({"e": col(b)})))
    d = compare_stats(sa, sb, max_psi=0.25)["columns"]["e"]
    assert d["psi"] == pytest.approx(0.0, abs=1e-6) and d["norm_shift"] == pytest.approx(0.0, abs=1e-6)
    assert d["mean_vector_cosine"] == pytest.approx(-1.0, abs=1e-6)
