from __future__ import annotations

import dataclasses
import itertools
import json
import os
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulkinfer.commit.ledger import Commit, CommitTally, Ledger
from bulkinfer.core.errors import JobMismatchError, LedgerError, LockedError
from bulkinfer.plan import JobPlan
from bulkinfer.sinks import Part
from bulkinfer.sources import ShardTable

from helpers import race


def _part(i: int) -> Part:
    return Part(name=f"part-{i:05d}.parquet", rows=10 + i, bytes=100, sha256="ab" * 32)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=st.lists(st.integers(0, 1000), unique=True, max_size=30), torn=st.integers(0, 60))
def test_commits_survive_a_torn_tail(tmp_path_factory, shards, torn):
    led = Ledger(tmp_path_factory.mktemp("out"))
    led.private.mkdir()
    for s in shards:
        led.commit(Commit.of(s, 0, 10 + s, _part(s)))
    with open(led.log_path, "ab") as fh:  # a crash in the middle of the next append
        fh.write(b'0badf00d {"shard": 99999, "file": "x"'[:torn])
    got = led.commits()
    assert [c.shard for c in got] == shards
    assert [c.rows for c in got] == [10 + s for s in shards]
    assert led.log_path.read_bytes().endswith(b"\n") or (not shards and led.log_path.stat().st_size == 0)


def test_corrupt_line_is_refused(tmp_path):
    led = Ledger(tmp_path)
    led.private.mkdir()
    for s in range(3):
        led.commit(Commit.of(s, 0, 1, _part(s)))
    lines = led.log_path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"rows":11', '"rows":12')
    led.log_path.write_text("".join(lines))
    with pytest.raises(LedgerError, match="commits.log:2"):
        led.commits()


def test_second_holder_is_refused_and_dead_holder_is_taken_over(tmp_path):
    first = Ledger(tmp_path)
    first.acquire()
    with pytest.raises(LockedError) as err:
        Ledger(tmp_path).acquire()
    assert str(os.getpid()) in str(err.value)
    assert Ledger(tmp_path).live_holder() is not None
    first.release()
    assert Ledger(tmp_path).live_holder() is None
    # a lock file left by a process that died (no flock held) is free
    (tmp_path / "_bulkinfer" / "lock").write_text(json.dumps({"pid": 999999, "host": "gone"}))
    again = Ledger(tmp_path)
    again.acquire()
    assert again.took_over_from is not None and "999999" in again.took_over_from
    again.release()


def test_begin_refuses_other_job_unless_overwrite(tmp_path):
    led = Ledger(tmp_path)
    led.acquire()
    job = {"fingerprint": "a", "model_digest": "m1", "inputs": [], "identity": {"x": 1}, "shards": []}
    led.begin(JobPlan.from_json(job), overwrite=False, stored=led.read_plan())
    assert led.read_plan() == JobPlan.from_json(job)
    led.commit(Commit.of(0, 0, 1, _part(0)))
    (tmp_path / "part-00000.parquet").write_text("x")
    with pytest.raises(JobMismatchError, match="model changed"):
        led.begin(
            JobPlan.from_json({**job, "fingerprint": "b", "model_digest": "m2"}),
            overwrite=False,
            stored=led.read_plan(),
        )
    with pytest.raises(JobMismatchError, match=r"config changed: x"):
        led.begin(
            JobPlan.from_json({**job, "fingerprint": "b", "identity": {"x": 2}}),
            overwrite=False,
            stored=led.read_plan(),
        )
    led.begin(JobPlan.from_json({**job, "fingerprint": "b"}), overwrite=True, stored=led.read_plan())
    assert led.commits() == []
    assert not (tmp_path / "part-00000.parquet").exists()
    led.release()


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "precious.txt").write_text("x")
    led = Ledger(tmp_path)
    led.acquire()
    with pytest.raises(Exception, match="not a bulkinfer output"):
        led.begin(JobPlan.from_json({"fingerprint": "a", "shards": []}), overwrite=False, stored=led.read_plan())
    led.release()


def test_remove_uncommitted_keeps_only_vouched_parts(tmp_path):
    led = Ledger(tmp_path)
    led.private.mkdir()
    c = led.commit(Commit.of(0, 0, 1, _part(0)))
    for name in ("part-00000.parquet", "part-00001.parquet", ".part-00002.parquet.tmp-1", "other.txt"):
        (tmp_path / name).write_text("x")
    removed = led.remove_uncommitted(CommitTally.of(led.iter_commits()))
    assert c.file == "part-00000.parquet"
    assert sorted(removed) == [".part-00002.parquet.tmp-1", "part-00001.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_bulkinfer", "other.txt", "part-00000.parquet"]


def test_runs_racing_for_a_folders_lock_left_by_a_dead_run_exactly_one_wins(tmp_path):
    """The lock file names a run that died (its flock died with it); eight runs start at once:
    one holds the lock and records whom it took over from, seven are refused."""
    (tmp_path / "_bulkinfer").mkdir()
    (tmp_path / "_bulkinfer" / "lock").write_text("pid 1 on elsewhere")
    ledgers = [Ledger(tmp_path) for _ in range(8)]
    results = [r if isinstance(r, Exception) else "held" for r in race(8, lambda i: ledgers[i].acquire())]
    won = [i for i, r in enumerate(results) if r == "held"]
    assert len(won) == 1 and sum(isinstance(r, LockedError) for r in results) == 7
    assert ledgers[won[0]].took_over_from == "pid 1 on elsewhere"
    ledgers[won[0]].release()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.integers(1, 9), max_size=12), cut=st.integers(0, 2000))
def test_group_commits_are_read_back_in_order_and_a_torn_group_keeps_its_whole_lines(tmp_path_factory, groups, cut):
    """Shards committed in groups (one append each) read back as committed one by one; an
    append cut anywhere (a crash mid-write) leaves exactly the group's lines that are whole."""
    led = Ledger(tmp_path_factory.mktemp("out"))
    led.private.mkdir()
    records, n = [], 0
    for size in groups:
        group = [Commit.of(n + i, 0, 10 + n + i, _part(n + i)) for i in range(size)]
        led.commit_many(group)
        records += group
        n += size
    assert led.commits() == records
    torn = [Commit.of(n + i, 0, 5, _part(n + i)) for i in range(3)]
    lines = b"".join(
        f"{zlib.crc32(b := json.dumps(dataclasses.asdict(c), sort_keys=True, separators=(',', ':')).encode()):08x} "
        .encode() + b + b"\n" for c in torn
    )  # fmt: skip
    with open(led.log_path, "ab") as fh:
        fh.write(lines[: cut % (len(lines) + 1)])
    whole = lines[: cut % (len(lines) + 1)].count(b"\n")
    assert led.commits() == records + torn[:whole]


def _planned(sizes):
    from bulkinfer.sources import Shard

    shards, row = [], 0
    for i, n in enumerate(sizes):
        shards.append(Shard(i, "in.jsonl", "jsonl", row, row + n, offset=row * 10, end=(row + n) * 10, base=row))
        row += n
    return shards


@settings(max_examples=80, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=25))
def test_remaining_work_is_every_row_no_commit_covers_and_untouched_shards_are_whole(data, sizes):
    from bulkinfer.commit.committer import remaining_work

    planned = _planned(sizes)
    commits = []
    for s in planned:  # each shard: some disjoint committed ranges, in any order
        cuts = sorted(data.draw(st.sets(st.integers(s.start, s.stop), max_size=6)))
        for a, b in itertools.pairwise(cuts):
            if data.draw(st.booleans()):
                commits.append(Commit.of(s.index, a, b, None))
    commits = data.draw(st.permutations(commits))
    todo = remaining_work(planned, iter(commits))  # folded as read
    assert isinstance(todo, ShardTable)  # columns: a million-shard job's work left is not a million objects
    done = {r for c in commits for r in range(c.start, c.stop)}
    left = [r for t in todo for r in range(t.start, t.stop)]
    assert sorted(left) == sorted(set(range(planned[-1].stop)) - done) and len(left) == len(set(left))
    touched = {c.shard for c in commits if c.stop > c.start}
    for t in todo:
        s = planned[t.index]
        assert s.start <= t.start < t.stop <= s.stop and (t.uri, t.offset, t.end, t.base) == (
            s.uri,
            s.offset,
            s.end,
            s.base,
        )
        if t.index not in touched:
            assert t == s  # whole, every field as planned


def test_success_reads_the_log_twice_and_lists_files_in_shard_order_with_the_error_files_in_force(tmp_path):
    """_SUCCESS from commits in shard order (a local run's log, never held) and out of it (a
    cluster's): the same document, the files sorted, the superseded error file left out."""
    from bulkinfer.commit.ledger import success_chunks

    records = [
        Commit.of(0, 0, 5, _part(0), errors=1, error_file="part-00000.jsonl"),
        Commit.of(1, 5, 9, _part(1)),
        Commit.of(1, 9, 12, _part(2), errors=2, error_file="part-00001_0000000009.jsonl"),
        Commit.of(2, 12, 20, None, errors=8, error_file="part-00002.jsonl"),
        Commit.of(0, 0, 5, None, error_file=None, replaces="part-00000.jsonl"),  # a retry fixed shard 0's row
    ]
    calls = []

    def read(order):
        def commits():
            calls.append(1)
            return (records[i] for i in order)

        return commits

    docs = []
    for order in ([0, 1, 2, 3, 4], [3, 1, 4, 2, 0]):
        calls.clear()
        text = "".join(success_chunks(read(order), "fp", inputs_failed=1))
        assert len(calls) == 2
        doc = json.loads(text)
        doc.pop("completed")
        docs.append(doc)
    assert docs[0] == docs[1]
    doc = docs[0]
    assert [(f["shard"], f["start"], f["name"]) for f in doc["files"]] == [
        (0, 0, "part-00000.parquet"), (1, 5, "part-00001.parquet"), (1, 9, "part-00002.parquet")]  # fmt: skip
    assert doc["rows"] == 10 + 11 + 12 and doc["rows_failed"] == 10
    assert doc["error_files"] == [
        "_errors/part-00001_0000000009.jsonl",
        "_errors/part-00002.jsonl",
        "_errors/inputs.jsonl",
    ]
    tally = CommitTally.of(records)  # what a resume folds the log into
    assert tally.names == {"part-00000.parquet", "part-00001.parquet", "part-00002.parquet"} and tally.records is None
    assert tally.failed_rows == 10
    assert tally.active_error_files() == ["part-00001_0000000009.jsonl", "part-00002.jsonl"]
    assert (list(tally.shard), list(tally.start), list(tally.stop)) == (
        [0, 1, 1, 2, 0],
        [0, 5, 9, 12, 0],
        [5, 9, 12, 20, 5],
    )
