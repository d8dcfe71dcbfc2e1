"""The gate's rows as output rows (WindowReuse.seed): each seeded input's first row in the run
takes the gate's result, once; repeats and other rows go on to dedupe or the model."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer import load_config
from bulkinfer.report import RunStats
from bulkinfer.runners.reuse import WindowReuse


def reuse(dedupe: bool = False) -> WindowReuse:
    cfg = load_config(overrides={"model.name": "m", "model.text_column": "t", "runtime.dedupe": dedupe})
    return WindowReuse(cfg, ["t"])


def taken(plan) -> dict[int, float]:
    """window position -> the seeded result it took"""
    out: dict[int, float] = {}
    for pos, cols in plan.reused:
        out.update(zip(pos.tolist(), cols["score"].to_pylist(), strict=True))
    return out


def test_seeded_rows_take_the_gates_results_once_and_the_rest_are_inferred():
    r = reuse()
    r.seed(pa.table({"t": ["a", "b", "c"]}), {"score": pa.array([1.0, 2.0, 3.0])})
    stats = RunStats()
    first = r.plan(pa.table({"t": ["x", "b", "b", "a"]}), stats)
    assert taken(first) == {1: 2.0, 3: 1.0}  # the repeat of "b" (position 2) is inferred
    assert first.compute.tolist() == [0, 2]
    second = r.plan(pa.table({"t": ["a", "c", "y"]}), stats)
    assert taken(second) == {1: 3.0}  # "a" was taken already: inferred now
    assert second.compute.tolist() == [0, 2]
    assert stats.rows_from_gate == 3
    third = r.plan(pa.table({"t": ["c"]}), stats)
    assert third.reused == [] and third.compute is None  # every seeded row taken: nothing is looked up


def test_a_seed_whose_outputs_do_not_match_its_rows_is_ignored():
    r = reuse()
    r.seed(pa.table({"t": ["a", "b"]}), {"score": pa.array([1.0])})
    plan = r.plan(pa.table({"t": ["a", "b"]}), RunStats())
    assert plan.reused == [] and plan.compute is None


def test_seeded_rows_come_before_dedupe_and_dedupe_copies_the_rest():
    r = reuse(dedupe=True)
    r.seed(pa.table({"t": ["a"]}), {"score": pa.array([7.0])})
    stats = RunStats()
    plan = r.plan(pa.table({"t": ["a", "a", "z", "z"]}), stats)
    assert taken(plan) == {0: 7.0}
    assert plan.compute.tolist() == [1, 2]  # the second "a" and the first "z" are inferred
    assert plan.dupes is not None and plan.dupes[0].tolist() == [3] and plan.dupes[1].tolist() == [2]
    assert stats.rows_from_gate == 1 and stats.rows_deduplicated == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from("abcdefgh"), min_size=0, max_size=6, unique=True),
    st.lists(st.lists(st.sampled_from("abcdefghij"), max_size=8), max_size=4),
)
def test_every_seeded_input_is_taken_at_most_once_at_its_first_row(seeded, windows):
    r = reuse()
    results = {t: float(i) for i, t in enumerate(seeded)}
    r.seed(pa.table({"t": pa.array(seeded, pa.string())}), {"score": pa.array(list(results.values()), pa.float64())})
    seen: set[str] = set()
    for rows in windows:
        plan = r.plan(pa.table({"t": pa.array(rows, pa.string())}), RunStats())
        expect = {}
        for pos, t in enumerate(rows):
            if t in results and t not in seen:
                expect[pos] = results[t]
                seen.add(t)
        assert taken(plan) == expect
        inferred = set(range(len(rows))) if plan.compute is None else set(plan.compute.tolist())
        assert inferred == set(range(len(rows))) - set(expect)
    assert np.isin(list(seen), seeded).all()
