from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.core.batching import bisect_call, plan_batches, restore_order

lengths_st = st.lists(st.integers(min_value=1, max_value=300), min_size=0, max_size=400)


@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_st,
    max_rows=st.integers(1, 64),
    max_tokens=st.one_of(st.none(), st.integers(1, 5000)),
    window=st.one_of(st.none(), st.integers(1, 500)),
    call_overhead=st.one_of(st.none(), st.floats(0, 500)),
)
def test_every_row_once_budget_respected_and_order_restored(lengths, max_rows, max_tokens, window, call_overhead):
    n = len(lengths)
    batches = plan_batches(lengths, n, max_rows, max_tokens, window, call_overhead)
    flat = np.concatenate(batches) if batches else np.empty(0, dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(n))
    for b in batches:
        assert 1 <= len(b) <= max_rows
        if max_tokens is not None and len(b) > 1:
            assert max(lengths[i] for i in b) * len(b) <= max_tokens
    if window:
        for b in batches:  # a batch never mixes rows of two windows
            assert len({int(i) // window for i in b}) == 1
    # outputs computed per batch, scattered back, equal the input order
    outputs = np.concatenate([np.asarray(b) * 10 for b in batches]) if batches else np.empty(0)
    rows, take = restore_order(batches)
    assert rows.tolist() == list(range(n))
    assert (outputs[take] == np.arange(n) * 10).all()


@given(n=st.integers(0, 300), max_rows=st.integers(1, 50))
def test_without_costs_rows_stay_in_order(n, max_rows):
    batches = plan_batches(None, n, max_rows)
    assert [int(i) for b in batches for i in b] == list(range(n))
    assert all(len(b) == max_rows for b in batches[:-1])


def test_sorting_cuts_padding():
    lengths = [5, 100, 5, 100, 5, 100, 5, 100]
    batches = plan_batches(lengths, 8, max_rows=4)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    assert padded == 4 * 5 + 4 * 100
    assert {frozenset(int(i) for i in b) for b in batches} == {frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})}


def test_a_row_over_the_budget_goes_alone():
    batches = plan_batches([10, 500, 10], 3, max_rows=8, max_tokens=100)
    assert [sorted(int(i) for i in b) for b in batches] == [[0, 2], [1]]


def test_restore_order_allows_missing_rows_refuses_duplicates():
    rows, take = restore_order([np.array([4, 0]), np.array([2])])
    assert rows.tolist() == [0, 2, 4] and take.tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match="a row appears in two batches"):
        restore_order([np.array([0, 1]), np.array([1])])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 200), bad=st.sets(st.integers(0, 199), max_size=20))
def test_bisect_call_isolates_exactly_the_bad_rows(n, bad):
    bad = {b for b in bad if b < n}
    calls = []

    def call(idx):
        calls.append(len(idx))
        if bad & set(idx.tolist()):
            raise ValueError("bad row")
        return idx * 2

    done, failed = bisect_call(np.arange(n), call, known_bad=bool(bad))
    assert sorted(r for r, _e in failed) == sorted(bad)
    good = np.concatenate([i for i, _r in done]) if done else np.empty(0, dtype=np.int64)
    assert sorted(good.tolist()) == sorted(set(range(n)) - bad)
    assert all((r == i * 2).all() for i, r in done)
    if len(bad) == 1 and n > 1:  # about log2(n) extra calls for one bad row
        assert len(calls) <= 2 * int(np.ceil(np.log2(n)))


def _cost(lengths, batches, overhead):
    return sum(overhead + len(b) * max(lengths[i] for i in b) for b in batches)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=9),
    max_rows=st.integers(1, 9),
    overhead=st.integers(0, 200),
)
def test_least_cost_cuts_are_optimal(lengths, max_rows, overhead):
    """No partition of the rows into calls of at most max_rows costs less (brute force over
    every set partition, which is also what allows calls that are not runs of sorted rows)."""

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for part in partitions(rest):
            for k in range(len(part)):
                yield [*part[:k], [first, *part[k]], *part[k + 1 :]]
            yield [[first], *part]

    best = min(
        _cost(lengths, p, overhead) for p in partitions(list(range(len(lengths)))) if all(len(b) <= max_rows for b in p)
    )
    batches = plan_batches(lengths, len(lengths), max_rows, call_overhead=overhead)
    assert _cost(lengths, batches, overhead) == best


def test_call_overhead_decides_between_padding_and_more_calls():
    lengths = [70, 5, 72, 6, 7]
    cuts = {
        overhead: sorted(sorted(int(i) for i in b) for b in plan_batches(lengths, 5, 16, call_overhead=overhead))
        for overhead in (0, 30, 1000)
    }
    assert cuts[0] == [[0], [1], [2], [3], [4]]  # calls are free: no padding at all
    assert cuts[30] == [[0, 2], [1, 3, 4]]  # short with short, long with long
    assert cuts[1000] == [[0, 1, 2, 3, 4]]  # calls are dear (a GPU): one call
