"""A job's shards held as columns (sources.shardtable): what goes in comes out, field for field."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from bulkinfer.sources import Shard, ShardTable

files = st.sampled_from([("a.jsonl", "jsonl", None), ("b.csv", "csv", "cp1252"), ("c.parquet", "parquet", None)])


@st.composite
def shards(draw):
    out, row = [], 0
    for i in range(draw(st.integers(0, 30))):
        uri, fmt, enc = draw(files)
        n = draw(st.integers(1, 10**6))
        lines = fmt != "parquet"
        off = draw(st.integers(0, 2**40)) if lines else None
        out.append(Shard(
            i, uri, fmt, row, row + n, off, None if off is None else off + draw(st.integers(1, 10**9)),
            row if lines and draw(st.booleans()) else None,
            tuple(draw(st.lists(st.integers(0, 10**6), max_size=3))), draw(st.booleans()), enc,
        ))  # fmt: skip
        row += n
    return out


@given(shards())
def test_every_field_of_every_shard_comes_back_and_the_table_compares_as_its_list(given_shards):
    table = ShardTable(given_shards)
    assert len(table) == len(given_shards)
    assert list(table) == given_shards and table == given_shards
    assert [table[i] for i in range(len(table))] == given_shards
    if given_shards:
        assert table[-1] == given_shards[-1] and table[1:3] == given_shards[1:3]
    assert table.indexes().tolist() == [s.index for s in given_shards]
    assert table.rows() == sum(s.num_rows for s in given_shards)
    assert table.uris() == list(dict.fromkeys(s.uri for s in given_shards))
    assert pickle.loads(pickle.dumps(table)) == given_shards
    assert table != [*given_shards, Shard(99, "z", "jsonl", 0, 1)]


def test_an_index_out_of_range_is_an_index_error_and_the_table_grows_while_its_columns_are_read():
    table = ShardTable([Shard(0, "a.jsonl", "jsonl", 0, 5, 0, 50, 0)])
    try:
        table[1]
    except IndexError:
        pass
    else:
        raise AssertionError("table[1] of a one-shard table")
    index = table.indexes()  # a copy: the table may still grow
    table.append(Shard(1, "a.jsonl", "jsonl", 5, 9, 50, 90, 5))
    assert index.tolist() == [0] and table.indexes().tolist() == [0, 1] and table.rows() == 9
