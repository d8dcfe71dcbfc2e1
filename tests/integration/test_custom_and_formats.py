from __future__ import annotations

import sys
import textwrap

import fsspec
import pyarrow.parquet as pq
import pytest

from bulkinfer import run_job

from helpers import job_config, read_output, tabular_table, write

ADAPTER_SRC = textwrap.dedent("""
    import numpy as np
    import pyarrow.compute as pc
    from bulkinfer import Adapter

    class Scorer(Adapter):
        input_columns = ("x1", "x2")

        def __init__(self, weight=1.0):
            self.weight = weight

        def setup(self, ctx):
            self.bias = 0.5

        def predict(self, batch):
            x1 = batch["x1"].to_numpy()
            x2 = batch["x2"].to_numpy()
            return {"score": self.weight * x1 + x2 + self.bias, "big": x1 > 0}

    class Lengths(Adapter):
        input_columns = ("text",)

        def cost(self, table):
            return [len(t) for t in table["text"].to_pylist()]

        def predict(self, batch):
            return {"n": [len(t) for t in batch["text"].to_pylist()]}

    def double(table):
        return {"double": pc.multiply(table["x1"], 2.0)}
""")


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(ADAPTER_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mymodels"
    sys.modules.pop("mymodels", None)


def _cfg(tmp_path, paths, **extra):
    return job_config(tmp_path / "out", paths, **{"source.shard_rows": 300, "runtime.batch_size": 64, **extra})


def test_adapter_subclass_with_options(tmp_path, user_module):
    t = tabular_table(700)
    write(t, tmp_path / "in.parquet", row_group_size=100)
    run_job(
        _cfg(
            tmp_path,
            [str(tmp_path / "in.parquet")],
            **{"model.name": "mymodels:Scorer", "model.options": {"weight": 3.0}},
        )
    )
    out = read_output(tmp_path / "out").sort_by("id")
    expect = 3.0 * t["x1"].to_numpy() + t["x2"].to_numpy() + 0.5
    assert out.column_names == ["id", "score", "big", "_input_hash"]
    assert out["score"].to_pylist() == pytest.approx(list(expect))
    assert out["big"].to_pylist() == list(t["x1"].to_numpy() > 0)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_formats_and_multi_file_glob_keep_ids_passthrough_and_order(tmp_path, user_module, fmt):
    tables = [tabular_table(n, seed=i, start=i * 1000) for i, n in enumerate([450, 1, 333])]
    for i, t in enumerate(tables):
        write(t, tmp_path / "in" / f"part{i}.{fmt}", row_group_size=64)
    cfg = _cfg(
        tmp_path,
        [str(tmp_path / "in" / f"part*.{fmt}")],
        **{
            "model.name": "mymodels:double",
            "model.feature_columns": ["x1"],
            "sink.keep_columns": ["segment"],
            "sink.format": fmt,
        },
    )
    result = run_job(cfg)
    out = read_output(tmp_path / "out")
    ids = [i for t in tables for i in t["id"].to_pylist()]
    assert out.num_rows == len(ids) == result.report["rows_out"]
    assert out["id"].to_pylist() == ids  # files and shards in plan order, rows in input order
    x1 = [x for t in tables for x in t["x1"].to_pylist()]
    assert out["double"].to_pylist() == pytest.approx([2 * x for x in x1])
    assert out["segment"].to_pylist() == [s for t in tables for s in t["segment"].to_pylist()]
    manifest = (tmp_path / "out" / "_SUCCESS").read_text()
    assert f'"rows": {len(ids)}' in manifest


def test_text_order_is_restored_within_each_shard(tmp_path, user_module):
    # sorting by length inside a window must not leak into the output order
    import pyarrow as pa

    texts = [("x" * (i * 37 % 101)) or "y" for i in range(500)]
    write(pa.table({"id": list(range(500)), "text": texts}), tmp_path / "t.parquet")
    result = run_job(
        _cfg(
            tmp_path,
            [str(tmp_path / "t.parquet")],
            **{"model.name": "mymodels:Lengths", "runtime.sort_window": 128, "runtime.batch_size": 16},
        )
    )
    out = read_output(tmp_path / "out")
    assert out["id"].to_pylist() == list(range(500))
    assert out["n"].to_pylist() == [len(t) for t in texts]
    assert result.report["batches"]["padding_ratio"] < 1.3  # it did sort: unsorted padding is ~2x


def test_fsspec_memory_input(tmp_path, user_module):
    fs = fsspec.filesystem("memory")
    with fs.open("/jobs/in/a.parquet", "wb") as fh:
        pq.write_table(tabular_table(120), fh)
    run_job(
        _cfg(
            tmp_path,
            ["memory://jobs/in/*.parquet"],
            **{"model.name": "mymodels:double", "model.feature_columns": ["x1"]},
        )
    )
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(120))
