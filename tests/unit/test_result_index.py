from __future__ import annotations

import itertools
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkinfer.serve.results import ResultIndex


def _run(tmp_path, parts):
    names = []
    for i, table in enumerate(parts):
        name = f"part-{i:05d}.parquet"
        pq.write_table(table, tmp_path / name)
        names.append(name)
    (tmp_path / "_SUCCESS").write_text(json.dumps({"files": [{"name": n} for n in names]}))
    return tmp_path


@pytest.mark.parametrize("make_id", [int, lambda i: f"sku-{i:04d}"])
def test_every_id_is_found_in_its_part_and_others_are_not(tmp_path, make_id):
    ids = [make_id(i) for i in range(0, 300, 3)]  # 100 ids over three parts of unequal length
    cut = [0, 10, 60, 100]
    parts = [pa.table({"id": ids[a:b], "y": [float(j) for j in range(a, b)]}) for a, b in itertools.pairwise(cut)]
    parts[1] = parts[1].take(list(reversed(range(parts[1].num_rows))))  # a part not sorted by id
    index = ResultIndex(_run(tmp_path, parts), "id")
    assert len(index) == 100
    for j, value in enumerate(ids):
        assert index.get(str(value)) == {"id": value, "y": float(j)}
    for missing in ("1", "sku-0001", "x", "-3", "299"):
        assert index.get(missing) is None
    assert index.parse_id("42") == (42 if make_id is int else "42")


def test_null_ids_are_not_indexed(tmp_path):
    index = ResultIndex(_run(tmp_path, [pa.table({"id": [3, None, 1], "y": [1.0, 2.0, 3.0]})]), "id")
    assert len(index) == 2
    assert index.get("1") == {"id": 1, "y": 3.0} and index.get("3") == {"id": 3, "y": 1.0}


def test_a_later_run_is_seen_even_when_its_manifest_keeps_the_same_mtime(tmp_path):
    """Some filesystems stamp to the second or coarser: a run that finishes within the same tick
    as the one being served still counts as newer (inode or size differ)."""
    index = ResultIndex(_run(tmp_path, [pa.table({"id": [1, 2], "y": [1.0, 2.0]})]), "id")
    assert index.newer() is None
    before = (tmp_path / "_SUCCESS").stat()
    _run(tmp_path, [pa.table({"id": [1, 2], "y": [1.0, 2.0]}), pa.table({"id": [7], "y": [7.0]})])
    os.utime(tmp_path / "_SUCCESS", ns=(before.st_atime_ns, before.st_mtime_ns))
    later = index.newer()
    assert later is not None and len(later) == 3 and later.get("7") == {"id": 7, "y": 7.0}
    assert later.newer() is None
