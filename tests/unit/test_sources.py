from __future__ import annotations

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulkinfer.errors import SourceError
from bulkinfer.sources import list_inputs, plan_shards, read_shard

from helpers import tabular_table, write


def _ids_by_shards(files, shard_rows):
    shards = plan_shards(files, shard_rows)
    ids = []
    for s in shards:
        got = pa.Table.from_batches(list(read_shard(s, ["id"], batch_rows=7)))
        assert got.num_rows == s.num_rows
        ids.extend(got["id"].to_pylist())
    return shards, ids


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 300),
    rg=st.integers(1, 120),
    shard_rows=st.integers(1, 150),
    fmt=st.sampled_from(["parquet", "csv", "jsonl"]),
)
def test_shards_cover_every_row_exactly_once(tmp_path_factory, n, rg, shard_rows, fmt):
    d = tmp_path_factory.mktemp("src")
    write(tabular_table(n), d / f"data.{fmt}", row_group_size=rg)
    files = list_inputs([str(d)])
    shards, ids = _ids_by_shards(files, shard_rows)
    assert ids == list(range(n))
    assert [s.index for s in shards] == list(range(len(shards)))
    if fmt != "parquet":
        assert all(s.num_rows <= shard_rows for s in shards)


def test_parquet_shards_follow_row_groups(tmp_path):
    write(tabular_table(1000), tmp_path / "a.parquet", row_group_size=100)
    shards = plan_shards(list_inputs([str(tmp_path / "a.parquet")]), 250)
    assert [(s.start, s.stop) for s in shards] == [(0, 200), (200, 400), (400, 600), (600, 800), (800, 1000)]


def test_planning_is_deterministic_and_globs_dirs_dedupe(tmp_path):
    for i in range(3):
        write(tabular_table(50, start=i * 50), tmp_path / f"p{i}.parquet")
    (tmp_path / "_ignored.parquet").write_text("x")
    (tmp_path / "notes.txt").write_text("x")
    a = list_inputs([str(tmp_path)])
    b = list_inputs([str(tmp_path / "p*.parquet"), str(tmp_path / "p1.parquet")])
    assert [f.uri for f in a] == [f.uri for f in b] == [str(tmp_path / f"p{i}.parquet") for i in range(3)]
    assert plan_shards(a, 20) == plan_shards(b, 20)


def test_fingerprint_changes_with_content(tmp_path):
    p = write(tabular_table(50), tmp_path / "a.parquet")
    before = list_inputs([str(p)])[0]
    write(tabular_table(50, seed=9), p)
    after = list_inputs([str(p)])[0]
    assert before.digest != after.digest


def test_memory_filesystem_uri():
    fs = fsspec.filesystem("memory")
    with fs.open("/bulk/in/a.parquet", "wb") as fh:
        pq.write_table(tabular_table(30), fh)
    with fs.open("/bulk/in/b.jsonl", "wb") as fh:
        fh.write(b'{"id": 100}\n{"id": 101}\n')
    files = list_inputs(["memory://bulk/in"])
    assert [f.uri for f in files] == ["memory:///bulk/in/a.parquet", "memory:///bulk/in/b.jsonl"]
    _shards, ids = _ids_by_shards(files, 8)
    assert ids == [*range(30), 100, 101]


def test_missing_path_and_column_errors_name_the_file(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        list_inputs([str(tmp_path / "nope.parquet")])
    with pytest.raises(SourceError, match="matches no file"):
        list_inputs([str(tmp_path / "*.csv")])
    p = write(tabular_table(5), tmp_path / "a.csv")
    shard = plan_shards(list_inputs([str(p)]), 10)[0]
    with pytest.raises(SourceError) as err:
        list(read_shard(shard, ["id", "text"]))
    assert str(p) in str(err.value) and "'text'" in str(err.value)


def test_unknown_extension_asks_for_format(tmp_path):
    (tmp_path / "a.dat").write_text("id\n1\n")
    with pytest.raises(SourceError, match="source.format"):
        list_inputs([str(tmp_path / "a.dat")])
    assert list_inputs([str(tmp_path / "a.dat")], "csv")[0].format == "csv"
