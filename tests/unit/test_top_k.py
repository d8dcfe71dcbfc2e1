"""``sink.top_k``: each shard's best K, then the finish step's merge, equal a full sort of every
row (ties by id, null and NaN last), however the rows fall into parts and however often the
merge is cut short and run again."""

from __future__ import annotations

import itertools
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulkinfer.commit import topk
from bulkinfer.commit.ledger import Ledger
from bulkinfer.commit.topk import RANK, Best, keep_best
from bulkinfer.core.errors import ConfigError
from bulkinfer.sinks.files import serialize

SCORES = st.one_of(st.none(), st.just(math.nan), st.sampled_from([0.0, 0.5, 1.0, -2.0]), st.floats(-1e6, 1e6))


def _full_sort(rows: list[tuple[float | None, int]], k: int, descending: bool) -> list[int]:
    """The reference: every (score, id) sorted; None and NaN after every number, ties by id."""

    def key(row: tuple[float | None, int]) -> tuple[int, float, int]:
        score, ident = row
        if score is None or math.isnan(score):
            return (1, 0.0, ident)
        return (0, -score if descending else score, ident)

    return [ident for _, ident in sorted(rows, key=key)[:k]]


def _ledger(tmp_path_factory) -> Ledger:
    led = Ledger(tmp_path_factory.mktemp("out"))
    led.private.mkdir()
    return led


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scores=st.lists(SCORES, min_size=1, max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=6),
    k=st.integers(1, 30),
    descending=st.booleans(),
    fmt=st.sampled_from(["parquet", "jsonl"]),
    merge_rows=st.sampled_from([1, 7, 1_000_000]),
)
def test_shard_best_then_merge_is_the_full_sort(tmp_path_factory, scores, cuts, k, descending, fmt, merge_rows):
    ids = list(range(len(scores)))[::-1]  # ids not in input order: the tie-break is the id, not the position
    best = Best("score", k, descending, "id")
    led = _ledger(tmp_path_factory)
    bounds = sorted({0, len(scores), *(c for c in cuts if c < len(scores))})
    parts = []
    for n, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        shard = pa.table({"id": ids[lo:hi], "score": pa.array(scores[lo:hi], pa.float64()), "x": ids[lo:hi]})
        kept = best.rows(shard, "the model's output")
        assert kept.num_rows == min(k, hi - lo)
        assert kept["id"].to_pylist() == [i for i in shard["id"].to_pylist() if i in set(kept["id"].to_pylist())]
        led.write_file(f"part-{n:05d}.{fmt}", serialize(kept, fmt))
        parts.append(f"part-{n:05d}.{fmt}")
    old = topk.MERGE_ROWS
    topk.MERGE_ROWS = merge_rows
    try:
        restated, ranking = keep_best(best, led, parts, fmt, "zstd")
    finally:
        topk.MERGE_ROWS = old
    expected = _full_sort(list(zip(scores, ids, strict=True)), k, descending)
    got = pa.concat_tables(
        [_read(led, p, fmt) for p in parts if restated[p].rows], promote_options="permissive"
    ).sort_by(RANK)
    assert got["id"].to_pylist() == expected
    assert got[RANK].to_pylist() == list(range(1, len(expected) + 1))
    assert got["x"].to_pylist() == expected  # the whole row is kept, not only the ranked columns
    assert sum(p.rows for p in restated.values()) == len(expected)
    assert ranking == {"by": "score", "k": k, "order": "desc" if descending else "asc"}


def _read(led: Ledger, name: str, fmt: str) -> pa.Table:
    path = led.out_dir / name
    if fmt == "parquet":
        return pq.read_table(path)
    import pyarrow.json as pajson

    return pajson.read_json(path)


def test_a_second_finish_changes_nothing_and_a_half_cut_one_ends_the_same(tmp_path_factory):
    best = Best("score", 3, True, "id")
    led = _ledger(tmp_path_factory)
    parts = []
    for n in range(3):
        rows = pa.table({"id": [10 * n + i for i in range(4)], "score": [float((7 * n + 3 * i) % 5) for i in range(4)]})
        led.write_file(f"part-{n:05d}.parquet", serialize(best.rows(rows, "out"), "parquet"))
        parts.append(f"part-{n:05d}.parquet")
    snapshot = {p: (led.out_dir / p).read_bytes() for p in parts}
    once, _ = keep_best(best, led, parts, "parquet", "zstd")
    after_once = {p: (led.out_dir / p).read_bytes() for p in parts}
    twice, _ = keep_best(best, led, parts, "parquet", "zstd")
    assert twice == once
    assert {p: (led.out_dir / p).read_bytes() for p in parts} == after_once  # nothing rewritten
    # a finish killed after cutting the first part only: the rest are as staged
    for p in parts[1:]:
        led.write_file(p, snapshot[p])
    again, _ = keep_best(best, led, parts, "parquet", "zstd")
    assert again == once
    ranked = pa.concat_tables([pq.read_table(led.out_dir / p) for p in parts]).sort_by(RANK)
    assert ranked["id"].to_pylist() == [3, 20, 1]  # 4.0, 4.0, then the lowest id of the three 3.0s
    assert ranked["score"].to_pylist() == [4.0, 4.0, 3.0]


def test_a_missing_or_text_column_is_one_line_naming_the_setting():
    best = Best("score", 2, True, "id")
    with pytest.raises(ConfigError, match=r"^sink.top_k.by: the model's output has no column 'score'; its columns: "):
        best.rows(pa.table({"id": [1], "label": ["a"]}), "the model's output")
    with pytest.raises(ConfigError, match=r"^source.id_column: .* no column 'id'"):
        best.rows(pa.table({"key": [1], "score": [0.5]}), "the model's output")
    with pytest.raises(ConfigError, match=r"^sink.top_k.by: 'score' holds string, not numbers"):
        best.rows(pa.table({"id": [1], "score": ["high"]}), "the model's output")
