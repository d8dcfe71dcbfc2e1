"""The core in-process, in milliseconds: LocalRunner + Committer + Ledger + FileSink over a
few shards with an in-memory adapter (no model, no subprocess)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkinfer.adapters import Adapter
from bulkinfer.commit.committer import Committer, remaining_work
from bulkinfer.commit.ledger import Ledger
from bulkinfer.config import JobConfig
from bulkinfer.core.records import decode_records
from bulkinfer.report import RunStats
from bulkinfer.runners import LocalRunner
from bulkinfer.sinks import FileSink
from bulkinfer.sources import list_inputs, plan_shards

from helpers import write


class Doubler(Adapter):
    """``double = 2 * x``; rows whose ``x`` is in ``bad`` make a batch raise; the cost is
    ``x`` itself, so batches are sorted by it (not in input order)."""

    input_columns = ("x",)

    def __init__(self, bad: frozenset[int] = frozenset(), stop_at: int | None = None) -> None:
        self.bad, self.stop_at = bad, stop_at
        self.stop = threading.Event()
        self.calls = 0

    def cost(self, features):
        return [int(v) % 97 for v in features.column("x").to_pylist()]

    def predict(self, batch):
        self.calls += 1
        xs = batch.column("x").to_pylist()
        if any(x in self.bad for x in xs):
            raise ValueError(f"bad value among {len(xs)} rows")
        if self.stop_at is not None and self.stop_at in xs:
            self.stop.set()
        return {"double": [2 * x for x in xs]}


def _setup(tmp_path, n=250, shard_rows=60, fmt="jsonl", **runtime):
    src = write(pa.table({"id": list(range(n)), "x": [(i * 37) % 1000 for i in range(n)]}), tmp_path / f"in.{fmt}")
    cfg = JobConfig.model_validate(
        {
            "source": {"paths": [str(src)], "id_column": "id", "shard_rows": shard_rows},
            "runtime": {"batch_size": 8, "sort_window": 32, **runtime},
            "sink": {"path": str(tmp_path / "out")},
            "execution": {"max_error_rate": 0.5},
        }
    )
    shards = plan_shards(list_inputs(cfg.source.paths), shard_rows)
    sink = FileSink(tmp_path / "out")
    sink.start()
    ledger = Ledger(tmp_path / "out")
    ledger.private.mkdir()
    stats = RunStats(rows_planned=n)
    committer = Committer(ledger, sink, stats, cfg, {s.index: s.start for s in shards}, failed_before=0)
    return cfg, shards, sink, ledger, stats, committer


def _output(out) -> pa.Table:
    parts = sorted(p for p in out.iterdir() if p.name.startswith("part-"))
    return pa.concat_tables([pq.read_table(p) for p in parts])


def test_every_row_once_in_input_order(tmp_path):
    cfg, shards, _sink, ledger, stats, committer = _setup(tmp_path)
    adapter = Doubler()
    runner = LocalRunner(cfg, adapter, stats, threading.Event())
    runner.run(shards, committer)
    commits = ledger.commits()
    assert sorted((c.shard, c.start, c.stop) for c in commits) == [(s.index, s.start, s.stop) for s in shards]
    table = _output(tmp_path / "out")
    assert table.column("id").to_pylist() == list(range(250))  # batches ran sorted by cost, rows came back in order
    assert table.column("double").to_pylist() == [2 * ((i * 37) % 1000) for i in range(250)]
    assert stats.rows_out == 250 and stats.shards_committed == len(shards) == 5
    assert remaining_work(shards, commits) == []


def test_failing_rows_become_error_records_and_the_rest_is_written(tmp_path):
    cfg, shards, _sink, ledger, stats, committer = _setup(tmp_path)
    bad = {(i * 37) % 1000 for i in (3, 64, 65, 200)}
    runner = LocalRunner(cfg, Doubler(frozenset(bad)), stats, threading.Event())
    runner.run(shards, committer)
    table = _output(tmp_path / "out")
    assert table.column("id").to_pylist() == [i for i in range(250) if i not in (3, 64, 65, 200)]
    records = [r for p in sorted((tmp_path / "out" / "_errors").iterdir()) for r in decode_records(p.read_bytes())]
    assert sorted((r.row, r.id, r.stage, r.error_type) for r in records) == [
        (3, 3, "predict", "ValueError"),
        (64, 64, "predict", "ValueError"),
        (65, 65, "predict", "ValueError"),
        (200, 200, "predict", "ValueError"),
    ]
    assert {r.input for r in records} == {str(tmp_path / "in.jsonl")}
    assert sum(c.errors for c in ledger.commits()) == stats.rows_failed == 4


def test_a_stop_commits_the_rows_read_and_the_rerun_does_only_the_rest(tmp_path):
    cfg, shards, sink, ledger, stats, committer = _setup(tmp_path, n=200, shard_rows=200)
    adapter = Doubler(stop_at=(100 * 37) % 1000)  # row 100 is in the fourth window of 32
    runner = LocalRunner(cfg, adapter, stats, adapter.stop)
    runner.run(shards, committer)
    first = ledger.commits()
    assert len(first) == 1 and first[0].start == 0 and 0 < first[0].stop < 200  # a prefix, cut at a window end
    assert first[0].stop % 32 == 0
    todo = remaining_work(shards, first)
    assert [(s.index, s.start, s.stop) for s in todo] == [(0, first[0].stop, 200)]
    # the rerun: a fresh runner over the tail; its part is named by its start
    stats2 = RunStats(rows_planned=200)
    again = Committer(ledger, sink, stats2, cfg, {s.index: s.start for s in shards}, failed_before=0)
    LocalRunner(cfg, Doubler(), stats2, threading.Event()).run(todo, again)
    names = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("part-"))
    assert names == ["part-00000.parquet", f"part-00000_{first[0].stop:010d}.parquet"]
    assert _output(tmp_path / "out").column("id").to_pylist() == list(range(200))
    assert remaining_work(shards, ledger.commits()) == []


def test_the_error_budget_stops_the_run_with_the_first_error(tmp_path):
    cfg, shards, _sink, ledger, stats, committer = _setup(tmp_path)
    strict = cfg.model_copy(update={"execution": cfg.execution.model_copy(update={"max_error_rate": 0.0})})
    committer.cfg = strict
    from bulkinfer.core.errors import ErrorBudgetExceeded

    with pytest.raises(ErrorBudgetExceeded, match=r"1 rows failed, over the error budget of 0.*in\.jsonl row 3"):
        LocalRunner(strict, Doubler(frozenset({(3 * 37) % 1000})), stats, threading.Event()).run(shards, committer)
    assert [c.shard for c in ledger.commits()] == [0]  # the shard holding the bad row is committed, then the stop


def test_statistics_saves_are_spaced_by_what_the_last_one_took(tmp_path, monkeypatch):
    """A save of stats.json names every part it covers, so it grows with the job: the next one
    waits at least STATS_SPACING times the last one's duration (here a 20 ms save: 2 s), and a
    job of fast shards saves once, not after each commit."""
    import time

    import bulkinfer.commit.committer as committer_module

    cfg, shards, _sink, ledger, stats, committer = _setup(tmp_path)
    monkeypatch.setattr(committer_module, "STATS_EVERY_S", 0.0)
    monkeypatch.setattr(committer_module, "STATS_SPACING", 100)
    saves = []
    write = ledger.write_private

    def slow_write(name, data):
        saves.append(name)
        time.sleep(0.02)
        write(name, data)

    monkeypatch.setattr(ledger, "write_private", slow_write)
    committer._stats_every = 0.0
    LocalRunner(cfg, Doubler(), stats, threading.Event()).run(shards, committer)
    assert len(ledger.commits()) == 5 and saves == ["stats.json"]
    assert committer._stats_every >= 100 * 0.02
