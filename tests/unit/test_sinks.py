from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from bulkinfer.adapters import to_arrow_column
from bulkinfer.sinks import part_name, write_part


@pytest.fixture()
def table() -> pa.Table:
    emb = to_arrow_column(np.arange(6, dtype=np.float32).reshape(3, 2))
    return pa.table({"id": [1, 2, 3], "name": ["a", None, "c"], "embedding": emb})


def test_parquet_part_is_atomic_and_checksummed(tmp_path, table):
    part = write_part(tmp_path, part_name(3, "parquet"), table, "parquet")
    assert part.name == "part-00003.parquet"
    assert [p.name for p in tmp_path.iterdir()] == ["part-00003.parquet"]
    data = (tmp_path / part.name).read_bytes()
    assert part.sha256 == hashlib.sha256(data).hexdigest() and part.bytes == len(data) and part.rows == 3
    back = pq.read_table(tmp_path / part.name)
    assert back.equals(table)
    assert back.schema.field("embedding").type == pa.list_(pa.float32(), 2)


def test_jsonl_and_csv_parts(tmp_path, table):
    write_part(tmp_path, part_name(0, "jsonl"), table, "jsonl")
    rows = [json.loads(x) for x in (tmp_path / "part-00000.jsonl").read_text().splitlines()]
    assert rows == [
        {"id": 1, "name": "a", "embedding": [0.0, 1.0]},
        {"id": 2, "name": None, "embedding": [2.0, 3.0]},
        {"id": 3, "name": "c", "embedding": [4.0, 5.0]},
    ]
    write_part(tmp_path, part_name(0, "csv"), table, "csv")
    back = pacsv.read_csv(tmp_path / "part-00000.csv")
    assert back["id"].to_pylist() == [1, 2, 3]
    assert [json.loads(x) for x in back["embedding"].to_pylist()] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def test_unwritable_directory_is_a_clear_error(tmp_path, table):
    from bulkinfer.core.errors import OutputError

    missing = tmp_path / "gone"
    with pytest.raises(OutputError, match="cannot write the part"):
        write_part(missing, "part-00000.parquet", table, "parquet")


def test_to_arrow_column_shapes():
    assert to_arrow_column(np.array([1, 2])).to_pylist() == [1, 2]
    assert to_arrow_column([[1.0], [2.0]]).to_pylist() == [[1.0], [2.0]]
    fixed = to_arrow_column(np.ones((2, 3), dtype=np.float32))
    assert fixed.type == pa.list_(pa.float32(), 3)


def _group(tmp_path, n: int):
    """A folder sink, its ledger and committer, and ``n`` parts staged as a cluster's workers stage them."""
    from bulkinfer import load_config
    from bulkinfer.commit.committer import Committer
    from bulkinfer.commit.ledger import Ledger
    from bulkinfer.core.records import ErrorRecord
    from bulkinfer.report import RunStats
    from bulkinfer.sinks import make_sink
    from bulkinfer.sources import Shard
    from bulkinfer.sources.shard import ShardOutput

    cfg = load_config(overrides={"sink.path": str(tmp_path / "out"), "source.paths": ["x.jsonl"], "model.name": "x:y",
                                 "execution.max_error_rate": 1.0})  # fmt: skip
    sink = make_sink(cfg)
    sink.start()
    shards = [Shard(i, "x.jsonl", "jsonl", 2 * i, 2 * i + 2) for i in range(n)]
    rows = pa.table({"id": [0, 1], "y": [0.5, 1.5]})
    bad = [ErrorRecord.of("x.jsonl", 1, "predict", ValueError("no"))]
    staged = [sink.stage(ShardOutput(s, rows, bad if s.index % 2 else []), None, tag="w") for s in shards]
    ledger = Ledger(tmp_path / "out")
    ledger.acquire()
    stats = RunStats(rows_planned=2 * n)
    return sink, ledger, Committer(ledger, sink, stats, cfg, {s.index: s.start for s in shards}, 0), staged


def _visible(tmp_path) -> set[str]:
    out = tmp_path / "out"
    return {p.name for p in out.glob("part-*")} | {f"_errors/{p.name}" for p in (out / "_errors").glob("part-*")}


def test_a_group_commit_records_every_shard_with_one_append_and_leaves_each_part_in_place(tmp_path):
    _sink, ledger, committer, staged = _group(tmp_path, 6)
    committer.publish_many(staged)
    assert [c.shard for c in ledger.commits()] == list(range(6))
    assert _visible(tmp_path) == {f"part-{i:05d}.parquet" for i in range(6)} | {
        f"_errors/part-{i:05d}.jsonl" for i in (1, 3, 5)
    }
    assert committer.stats.shards_committed == 6 and committer.stats.rows_failed == 3
    assert ledger.log_path.read_text().count("\n") == 6 and not list((tmp_path / "out").glob(".part-*"))


def test_a_group_whose_ledger_append_fails_withdraws_exactly_the_parts_no_line_vouches_for(tmp_path, monkeypatch):
    """The append wrote the first 2 lines whole and then the disk filled: those 2 shards stay
    committed with their parts; the others' parts and error files are taken back."""
    _sink, ledger, committer, staged = _group(tmp_path, 5)
    real = ledger.commit_many

    def fill_up(records):
        real(records[:2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ledger, "commit_many", fill_up)
    with pytest.raises(OSError):
        committer.publish_many(staged)
    assert [c.shard for c in ledger.commits()] == [0, 1]
    assert _visible(tmp_path) == {"part-00000.parquet", "part-00001.parquet", "_errors/part-00001.jsonl"}


def test_a_group_whose_rename_fails_midway_takes_back_the_parts_renamed_before_it(tmp_path):
    _sink, ledger, committer, staged = _group(tmp_path, 4)
    (tmp_path / "out" / staged[2].part.temp).unlink()  # its staged file is gone: the rename fails
    with pytest.raises(Exception, match="cannot write the part"):
        committer.publish_many(staged)
    assert ledger.commits() == [] and _visible(tmp_path) == set()


def test_a_stores_answer_is_named_with_its_status_and_code_or_its_status_alone():
    """botocore's ClientError as s3fs raises it (under an OSError): a 503 with a body gives its
    code and message; a HEAD's 503 (no body: botocore sets the code to the status) its status."""
    from botocore.exceptions import ClientError

    from bulkinfer.sinks.objects import _why

    def raised(code: str, message: str) -> OSError:
        meta = {"HTTPStatusCode": 503}
        cause = ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": meta}, "HeadObject")
        try:
            raise OSError("s3fs's wrapper") from cause
        except OSError as exc:
            return exc

    assert (
        _why(raised("SlowDown", "Please reduce your request rate.")) == "503 SlowDown: Please reduce your request rate."
    )
    assert _why(raised("503", "Service Unavailable")) == "503 Service Unavailable"
    assert _why(OSError("disk full")) == "disk full"
