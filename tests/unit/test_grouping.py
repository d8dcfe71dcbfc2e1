"""How many shards a cluster backend hands a worker in one call (runners.grouping)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bulkinfer.runners.grouping import MOST, Grouper


def test_the_first_call_takes_one_shard_and_fast_shards_are_grouped_up_to_a_share_of_the_queue():
    g = Grouper(call_s=0.5)
    assert g.size(10_000, 2) == 1  # nothing measured yet
    g.observe(0.004, 1)  # 4 ms a shard: 125 fill half a second
    assert g.size(10_000, 2) == MOST
    assert g.size(100, 2) == 25  # half of each worker's share of what waits
    assert g.size(3, 2) == 1
    g2 = Grouper(call_s=0.5)
    g2.observe(2.0, 1)  # slow shards: one a call
    assert g2.size(10_000, 2) == 1
    g3 = Grouper(call_s=0.5)
    g3.observe(0.05, 1)
    assert g3.size(10_000, 4) == 10


def test_the_estimate_follows_the_calls_measured():
    g = Grouper(call_s=1.0, most=1000)
    g.observe(0.01, 1)
    g.observe(0.4, 20)  # 20 ms a shard
    assert g.shard_s is not None and abs(g.shard_s - (0.7 * 0.01 + 0.3 * 0.02)) < 1e-12
    assert g.size(10**6, 1) == int(1.0 / g.shard_s)
    g.observe(1.0, 0)  # a call that finished nothing says nothing
    g.observe(-1.0, 3)
    assert abs(g.shard_s - 0.013) < 1e-12


@given(
    calls=st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.integers(1, 500)), max_size=20),
    waiting=st.integers(0, 10**7),
    workers=st.integers(0, 10_000),
    most=st.integers(1, 256),
)
def test_a_group_is_never_empty_nor_more_than_the_cap_or_half_a_share(calls, waiting, workers, most):
    g = Grouper(most=most)
    for seconds, shards in calls:
        g.observe(seconds, shards)
    k = g.size(waiting, workers)
    assert 1 <= k <= max(1, min(most, waiting // (2 * max(1, workers))))
    if not calls:
        assert k == 1


def test_the_queue_hands_out_put_back_shards_first_then_the_plan_in_order_then_split_tails():
    from bulkinfer.runners.grouping import ShardQueue
    from bulkinfer.sources import Shard, ShardTable

    plan = ShardTable(
        Shard(i, "in.jsonl", "jsonl", 10 * i, 10 * i + 10, 100 * i, 100 * i + 100, 10 * i) for i in range(5)
    )
    q = ShardQueue(plan)
    assert len(q) == 5
    first, second = q.popleft(), q.popleft()
    assert (first, second) == (plan[0], plan[1])
    q.append(Shard(1, "in.jsonl", "jsonl", 15, 20, 100, 200, 10))  # a straggler's tail: last
    q.extendleft([first, second])  # a lost worker's group: first, in its order
    assert len(q) == 6
    assert [(s.index, s.start) for s in (q.popleft() for _ in range(6))] == [
        (0, 0), (1, 10), (2, 20), (3, 30), (4, 40), (1, 15)]  # fmt: skip
    assert not q
