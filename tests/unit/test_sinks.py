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
