from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from bulkinfer.adapters import Adapter
from bulkinfer.adapters.custom import FunctionAdapter
from bulkinfer.serve.batcher import Batcher, Overloaded, measure_call_overhead


def _double(table: pa.Table) -> dict[str, pa.Array]:
    if pc.any(pc.less(table["x"], 0)).as_py():
        raise ValueError("negative x")
    return {"y": pc.multiply(table["x"], 2)}


def test_merged_requests_get_their_own_rows_and_a_bad_one_fails_alone():
    """The first request's call is held until the other eleven are queued, so they merge into
    the next calls whatever the machine's speed (no wait window: max_wait_s = 0)."""
    calls: list[int] = []
    first_call, release = threading.Event(), threading.Event()

    def held(table: pa.Table) -> dict[str, pa.Array]:
        if not first_call.is_set():
            first_call.set()
            release.wait(10)
        return _double(table)

    batcher = Batcher(
        FunctionAdapter(held, ["x"]), max_rows=16, max_wait_s=0, max_queue_rows=1000,
        on_batch=lambda rows, requests: calls.append(requests),
    )  # fmt: skip
    requests = [pa.table({"x": list(range(i, i + 1 + i % 3))}) for i in range(12)]
    requests[5] = pa.table({"x": [1, -1]})
    futures = [batcher.submit(requests[0])]
    assert first_call.wait(10)
    futures += [batcher.submit(t) for t in requests[1:]]
    release.set()
    for i, (table, future) in enumerate(zip(requests, futures, strict=True)):
        if i == 5:
            with pytest.raises(ValueError, match="negative x"):
                future.result(timeout=10)
        else:
            assert future.result(timeout=10).columns["y"].to_pylist() == [2 * v for v in table["x"].to_pylist()]
    # 1 request alone, then the 22 queued rows in calls of at most 16 rows: 8 requests (16 rows), then 3 (6)
    assert calls == [1, 8, 3]
    batcher.close()


def test_full_queue_refuses_at_once():
    gate = threading.Event()

    def slow(table: pa.Table) -> dict[str, pa.Array]:
        gate.wait(10)
        return {"y": table["x"]}

    batcher = Batcher(FunctionAdapter(slow, ["x"]), max_rows=1, max_wait_s=0, max_queue_rows=3)
    first = batcher.submit(pa.table({"x": [0]}))
    queued = [batcher.submit(pa.table({"x": [i]})) for i in range(1, 3)]
    with pytest.raises(Overloaded, match=r"serve.max_queue_rows=3"):
        for i in range(3, 10):
            queued.append(batcher.submit(pa.table({"x": [i]})))
    gate.set()
    assert [f.result(timeout=10).columns["y"].to_pylist() for f in [first, *queued]] == [
        [i] for i in range(len(queued) + 1)
    ]
    batcher.close()


class _Timed(Adapter):
    """A model whose call takes ``fixed`` seconds plus ``per_token`` for each padded token,
    on its own clock (no sleeps: the figures do not depend on how busy the machine is)."""

    input_columns = ("text",)

    def __init__(self, fixed: float, per_token: float) -> None:
        self.fixed, self.per_token = fixed, per_token
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def preprocess(self, table: pa.Table) -> list[int]:
        return [len(t.split()) for t in table["text"].to_pylist()]

    def cost(self, features):
        return features

    def predict(self, batch):
        self.now += self.fixed + self.per_token * len(batch) * max(batch)
        return {"n": batch}


def test_call_overhead_is_measured_in_tokens():
    sample = pa.table({"text": ["a b c d"] * 16})
    # one call costs 20 ms, a token 1 ms: a call is worth 20 tokens
    timed = _Timed(0.020, 0.001)
    assert measure_call_overhead(timed, sample, repeats=3, clock=timed.clock) == pytest.approx(20.0)
    # a bigger call costs nothing more (a GPU's regime): merge everything
    flat = _Timed(0.010, 0.0)
    assert measure_call_overhead(flat, sample, repeats=3, clock=flat.clock) == 1e6
    # without per-row costs there is nothing to cut by
    assert measure_call_overhead(FunctionAdapter(_double, ["x"]), pa.table({"x": [1, 2]})) is None
