from __future__ import annotations

import pyarrow as pa

from bulkinfer.precision.gate import sample_rows
from bulkinfer.sources import list_inputs, plan_shards

from helpers import write


def _shards(tmp_path, n, shard_rows):
    write(pa.table({"id": list(range(n))}), tmp_path / "in.parquet", row_group_size=shard_rows)
    return plan_shards(list_inputs([str(tmp_path / "in.parquet")]), shard_rows)


def test_the_sample_spans_the_input_not_its_head(tmp_path):
    shards = _shards(tmp_path, 1000, 100)  # ten shards
    got = sample_rows(shards, ["id"], 40, spread=4).column("id").to_pylist()
    assert got == [*range(0, 10), *range(300, 310), *range(600, 610), *range(900, 910)]


def test_short_shards_leave_their_quota_to_the_next(tmp_path):
    shards = _shards(tmp_path, 15, 5)  # three shards of five rows
    assert sample_rows(shards, ["id"], 14).column("id").to_pylist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert sample_rows(shards, ["id"], 6).column("id").to_pylist() == [0, 1, 5, 6, 10, 11]
    assert sample_rows(shards, ["id"], 99).num_rows == 15
    assert sample_rows([], ["id"], 5).num_rows == 0
