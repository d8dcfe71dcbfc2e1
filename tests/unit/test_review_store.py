"""The review queue's decisions and leases (outputs/review.py): a decision is taken once however
many reviewers race for it, a held row is nobody else's until its lease runs out, decisions
survive a restart and are what decisions.parquet holds."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.outputs.review import DECISIONS, Conflict, ReviewStore

from helpers import race

IDS = [f"r{i}" for i in range(6)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_racing_reviewers_decide_a_row_once_and_the_losers_are_told_who_won(tmp_path):
    store = ReviewStore(tmp_path, IDS, lease_s=60)
    results = race(8, lambda i: store.decide("r3", f"rev{i}", "reject" if i % 2 else "approve"))
    won = [r for r in results if not isinstance(r, Exception)]
    assert len(won) == 1
    lost = [r for r in results if isinstance(r, Exception)]
    assert all(isinstance(e, Conflict) and f"decided by {won[0].reviewer}" in str(e) for e in lost)
    assert list(store.decisions()) == ["r3"]


def test_a_held_row_is_nobody_elses_until_its_lease_runs_out(tmp_path):
    clock = Clock()
    store = ReviewStore(tmp_path, IDS, lease_s=60, clock=clock)
    assert store.lease("alice") == "r0" and store.lease("bob") == "r1"
    assert store.lease("alice") == "r0"  # a reload gets the row she holds, not a new one
    with pytest.raises(Conflict, match=r"row 'r0' is held by alice until 1970-01-01 00:17:40 UTC") as held:
        store.decide("r0", "bob", "approve")
    assert held.value.status == 409
    with pytest.raises(Conflict, match=r"not in this review queue") as missing:
        store.decide("r99", "bob", "approve")
    assert missing.value.status == 404
    clock.now += 61  # alice's lease has run out: r0 is free again
    assert store.lease("carol") == "r0"
    store.decide("r0", "carol", "reject", "too much")
    assert store.lease("alice") == "r1" and store.holders() == {"r1": "alice"}  # bob's ran out too


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alice", "bob", "carol"]), st.sampled_from(IDS),
                          st.sampled_from(["approve", "reject"]), st.booleans()), max_size=20))  # fmt: skip
def test_any_sequence_of_calls_decides_each_row_at_most_once_and_survives_a_restart(tmp_path_factory, calls):
    folder = tmp_path_factory.mktemp("queue")
    clock = Clock()
    store = ReviewStore(folder, IDS, lease_s=30, clock=clock)
    taken: dict[str, tuple[str, str]] = {}
    for reviewer, row, verdict, wait in calls:
        if wait:
            clock.now += 31
        held = store.holders().get(row)
        try:
            store.decide(row, reviewer, verdict)
        except Conflict:
            assert row in taken or (held is not None and held != reviewer)
            continue
        assert row not in taken
        taken[row] = (reviewer, verdict)
        store.lease(reviewer)
    store.close()
    again = ReviewStore(folder, IDS, lease_s=30, clock=clock)
    assert {i: (d.reviewer, d.verdict) for i, d in again.decisions().items()} == taken
    table = pq.read_table(folder / DECISIONS)
    assert {r["id"]: (r["reviewer"], r["verdict"]) for r in table.to_pylist()} == taken
