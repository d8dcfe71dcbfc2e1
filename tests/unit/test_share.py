"""Online first: the model share's order of calls and step sizes, and the shared adapter's
steps, which must answer exactly what one whole call answers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.adapters import Adapter
from bulkinfer.serve.share import ModelShare, SharedModel


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_steps_fit_the_step_time_while_online_traffic_comes_and_double_back_when_it_stops():
    clock = Clock()
    share = ModelShare(step_s=0.025, quiet_s=1.0, clock=clock)
    assert share.step_rows(500) == 500  # no online traffic, nothing measured: the whole call
    share.online_queued(1)
    share.online_done(1)
    assert share.step_rows(500) == 1  # online traffic, nothing measured yet: one row to measure
    clock.t += share.gap_s  # a step starts once online traffic left a gap
    with share.batch_step(1):
        clock.t += 0.005  # 5 ms a row
    assert share.step_rows(500) == 5  # 25 ms of rows
    clock.t += 1.5  # online traffic stopped
    assert [share.step_rows(500) for _ in range(8)] == [10, 20, 40, 80, 160, 320, 500, 500]
    share.online_queued(1)  # it is back: short steps at once
    assert share.step_rows(500) == 5
    share.online_done(1)


def test_a_batch_step_waits_while_an_online_request_is_queued_and_an_online_call_waits_for_a_running_step():
    share = ModelShare(step_s=0.02)
    order: list[str] = []
    share.online_queued(1)
    started = threading.Event()

    def batch() -> None:
        with share.batch_step(4):
            order.append("batch step")
            started.set()
            time.sleep(0.05)
        order.append("batch step done")

    t = threading.Thread(target=batch)
    t.start()
    time.sleep(0.1)
    assert order == []  # an online request waits: the batch does not take the model
    with share.online_call():
        order.append("online call")
    share.online_done(1)
    assert started.wait(5)
    share.online_queued(1)  # arrives while the step runs: waits for that step only
    with share.online_call():
        order.append("online call 2")
    share.online_done(1)
    t.join()
    assert order == ["online call", "batch step", "batch step done", "online call 2"]
    assert share.yielded_s >= 0.1 and share.batch_rows == 4


class Doubler(Adapter):
    input_columns = ("x",)

    def __init__(self) -> None:
        self.calls: list[int] = []

    def preprocess(self, table: pa.Table) -> np.ndarray:
        return table.column("x").to_numpy()

    def predict(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        self.calls.append(len(batch))
        return {"y": batch * 2, "m": np.stack([batch, -batch], axis=1)}


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    picks=st.lists(st.integers(0, 59), min_size=1, max_size=40),
    step=st.integers(1, 9),
)
def test_a_call_in_steps_answers_what_one_whole_call_answers(n, picks, step):
    inner = Doubler()
    share = ModelShare(step_s=1.0)
    share.step_rows = lambda total: min(total, step)  # type: ignore[method-assign]
    shared = SharedModel(inner, share)
    features = shared.preprocess(pa.table({"x": np.arange(n, dtype=np.int64) * 3 + 1}))
    idx = np.array([p % n for p in picks])
    got = shared.postprocess(shared.predict(shared.select(features, idx)))
    want = inner.predict(inner.select(features, idx))
    assert got["y"].to_pylist() == want["y"].tolist()
    assert got["m"].to_pylist() == want["m"].tolist()
    assert inner.calls[:-1] == [min(step, len(idx) - i) for i in range(0, len(idx), step)]
    sub = np.arange(len(idx))[::2]  # a selection of a selection (the runner's bisection)
    again = shared.predict(shared.select(shared.select(features, idx), sub))
    assert again["y"].to_pylist() == (features[idx][sub] * 2).tolist()
