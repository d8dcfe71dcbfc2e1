"""A cluster backend's worker (runners.worker) in this process: a call of several shards
stages each as it finishes, and a failure mid-call answers the shards finished before it."""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pyarrow as pa

from bulkinfer.adapters import build_adapter, resolve_model
from bulkinfer.commit.committer import Committer
from bulkinfer.commit.ledger import Ledger
from bulkinfer.core.errors import ModelError
from bulkinfer.report import RunStats
from bulkinfer.runners.worker import Worker
from bulkinfer.sinks import make_sink
from bulkinfer.sources import list_inputs, plan_shards

from helpers import fresh_module, job_config, read_output, write

MODEL = textwrap.dedent("""
    import pyarrow.compute as pc

    def wrong_on_13(table):
        if 13 in table["x"].to_pylist():
            return {"y": [0]}  # one value for the whole batch: the model is broken, not a row
        return {"y": pc.multiply(table["x"], 2)}
""")


def test_a_call_of_several_shards_answers_each_and_a_failure_keeps_those_before_it(tmp_path, monkeypatch):
    name = fresh_module(tmp_path, monkeypatch, "workermodel", MODEL)
    write(pa.table({"id": np.arange(40), "x": np.arange(40)}), tmp_path / "in.parquet", row_group_size=10)
    out = tmp_path / "out"
    out.mkdir()
    cfg = job_config(out, [tmp_path / "in.parquet"], **{
        "model.name": f"{name}:wrong_on_13", "model.feature_columns": ["x"], "source.shard_rows": 10,
        "execution.backend": "ray"})  # fmt: skip
    shards = plan_shards(list_inputs(cfg.source.paths, "auto"), 10)
    assert [(s.start, s.stop) for s in shards] == [(0, 10), (10, 20), (20, 30), (30, 40)]
    ledger = Ledger(out)
    ledger.acquire()
    committer = Committer(ledger, make_sink(cfg), RunStats(rows_planned=40), cfg, {}, failed_before=0)
    build_adapter(cfg, resolve_model(cfg))  # the driver's check that the model resolves
    worker = Worker(cfg.model_dump(mode="json"), os.getcwd(), list(sys.path))
    assert worker.error is None
    try:
        fine = worker.process([shards[2], shards[3], shards[0]], [None, None, None], "t1", committer.stamp)
        assert fine["error"] is None
        assert [r["staged"].shard.start for r in fine["results"]] == [20, 30, 0]  # each staged, in order
        assert [r["figures"] is None for r in fine["results"]] == [True, True, False]  # the call's, once
        assert fine["results"][-1]["figures"]["rows_inferred"] == 30

        broken = worker.process([shards[0], shards[1], shards[2]], [None, None, None], "t2", committer.stamp)
        assert [r["staged"].shard.start for r in broken["results"]] == [0]  # shard 0 finished before it
        err = broken["error"]
        assert isinstance(err, ModelError) and "output 'y' has 1 values for a batch of 10 rows" in str(err)
        # what came back is committed as any staged part is: the rows of shard 0 of the second call
        committer.publish_many([broken["results"][0]["staged"]])
        assert [(c.start, c.stop) for c in ledger.commits()] == [(0, 10)]
        assert read_output(out).sort_by("id")["y"].to_pylist() == [2 * i for i in range(10)]
    finally:
        worker.close()
        ledger.release()
