"""A Parquet row group larger than a shard is decoded once for all its shards read in order
(the reader that ends a shard inside it keeps its place), and whatever the order, sizes or
repeats, every shard reads exactly its own rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.sources import list_inputs, plan_shards, read_shard, reading_in_order


def _file(path, rows: int, group: int):
    pq.write_table(pa.table({"id": np.arange(rows), "x": np.arange(rows) * 2.0}), path, row_group_size=group)
    return path


def _read(shard, batch_rows):
    return [(int(i), float(x)) for b in read_shard(shard, ["id", "x"], batch_rows) for i, x in
            zip(b.column("id").to_pylist(), b.column("x").to_pylist(), strict=True)]  # fmt: skip


def _decoded(monkeypatch) -> list[int]:
    """Counts the rows pyarrow decodes."""
    seen: list[int] = []
    original = pq.ParquetFile.iter_batches

    def counting(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            seen.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    return seen


def test_shards_of_one_large_row_group_read_in_order_decode_it_once(tmp_path, monkeypatch):
    path = _file(tmp_path / "one.parquet", 10_000, 10_000)
    shards = plan_shards(list_inputs([str(path)], "auto"), 100, [])
    assert len(shards) == 100
    decoded = _decoded(monkeypatch)
    with reading_in_order():
        rows = [r for s in shards for r in _read(s, 64)]
    assert rows == [(i, 2.0 * i) for i in range(10_000)]
    assert sum(decoded) == 10_000  # each row decoded once (100 shards: 505,000 rows without the places)
    decoded.clear()
    rows = [r for s in shards[:10] for r in _read(s, 64)]  # outside a job's block: each shard on its own
    assert rows == [(i, 2.0 * i) for i in range(1_000)] and sum(decoded) > 5_000


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 600),
    group=st.integers(1, 700),
    shard_rows=st.integers(1, 250),
    batch_rows=st.integers(1, 90),
    order=st.randoms(use_true_random=False),
    repeats=st.integers(0, 3),
)
def test_every_shard_reads_its_own_rows_in_any_order(tmp_path_factory, rows, group, shard_rows, batch_rows, order,
                                                     repeats):  # fmt: skip
    path = _file(tmp_path_factory.mktemp("pq") / "f.parquet", rows, group)
    shards = plan_shards(list_inputs([str(path)], "auto"), shard_rows, [])
    sequence = list(shards) + [order.choice(shards) for _ in range(repeats)]
    half = len(sequence) // 2
    sequence = sequence[:half] + order.sample(sequence[half:], len(sequence) - half)  # in order, then shuffled
    with reading_in_order():
        for shard in sequence:
            got = _read(shard, batch_rows)
            assert got == [(i, 2.0 * i) for i in range(shard.start, shard.stop)], shard
