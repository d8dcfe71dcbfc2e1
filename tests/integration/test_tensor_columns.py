"""Tensor columns: a Parquet column of Arrow's ``fixed_shape_tensor``, of nested fixed-size
lists, or a JSONL file's nested lists feed an ONNX model's ``(N, 1, 8, 8)`` input as one batch;
its 4-D output comes back a ``fixed_shape_tensor`` column (Parquet) or nested lists (JSONL),
equal to the same filter computed here; a column of another shape is one line naming it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from bulkinfer import BulkinferError, run_job

from helpers import job_config, write

SIDE = 8
N = 37


def _smoother(path):
    """A 3 × 3 box filter (zero padding) and each grid's mean."""
    grid = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", 1, SIDE, SIDE])
    smooth = helper.make_tensor_value_info("smooth", TensorProto.FLOAT, ["N", 1, SIDE, SIDE])
    mean = helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N"])
    kernel = numpy_helper.from_array(np.full((1, 1, 3, 3), 1 / 9, np.float32), "K")
    axes = numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes")
    nodes = [
        helper.make_node("Conv", ["grid", "K"], ["smooth"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["grid", "axes"], ["mean"], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "smoother", [grid], [smooth, mean], [kernel, axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def _box(grids: np.ndarray) -> np.ndarray:
    padded = np.pad(grids, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return sum(padded[:, :, i : i + SIDE, j : j + SIDE] for i in range(3) for j in range(3)) / 9


def _grids(n: int = N) -> np.ndarray:
    rng = np.random.default_rng(3)
    return rng.random((n, 1, SIDE, SIDE), dtype=np.float32)


def _nested(grids: np.ndarray) -> pa.Array:
    flat = pa.array(grids.ravel())
    for size in reversed(grids.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def _input(tmp_path, form: str, grids: np.ndarray):
    ids = np.arange(len(grids))
    if form == "jsonl":
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps({"id": i, "grid": g.tolist()}) + "\n" for i, g in enumerate(grids)))
        return path
    column = pa.FixedShapeTensorArray.from_numpy_ndarray(grids) if form == "tensor" else _nested(grids)
    return write(pa.table({"id": ids, "grid": column}), tmp_path / "in.parquet")


@pytest.mark.parametrize(("form", "sink"), [("tensor", "parquet"), ("nested", "parquet"), ("jsonl", "jsonl")])
def test_a_tensor_column_feeds_the_model_and_its_tensor_output_is_written(tmp_path, form, sink):
    _smoother(tmp_path / "smoother.onnx")
    grids = _grids()
    path = _input(tmp_path, form, grids)
    cfg = job_config(tmp_path / "out", [path], **{"model.name": str(tmp_path / "smoother.onnx"),
                     "source.shard_rows": 10, "sink.format": sink, "runtime.batch_size": 4})  # fmt: skip
    result = run_job(cfg)
    assert result.report["rows_out"] == N
    if sink == "parquet":
        out = pq.read_table(tmp_path / "out").sort_by("id")
        assert isinstance(out.schema.field("smooth").type, pa.FixedShapeTensorType)
        assert out.schema.field("smooth").type.shape == [1, SIDE, SIDE]
        smooth = out["smooth"].combine_chunks().to_numpy_ndarray()
        mean = out["mean"].to_numpy()
    else:
        rows = sorted((json.loads(line) for p in (tmp_path / "out").glob("part-*") for line in p.read_text().splitlines()),
                      key=lambda r: r["id"])  # fmt: skip
        smooth = np.array([r["smooth"] for r in rows], np.float32)
        mean = np.array([r["mean"] for r in rows])
    assert smooth.shape == (N, 1, SIDE, SIDE)
    np.testing.assert_allclose(smooth, _box(grids), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean, grids.mean(axis=(1, 2, 3)), rtol=1e-5)


def test_a_column_of_another_shape_is_one_line_naming_it(tmp_path):
    _smoother(tmp_path / "smoother.onnx")
    small = np.zeros((4, 1, 6, 6), np.float32)
    path = write(pa.table({"id": np.arange(4), "grid": pa.FixedShapeTensorArray.from_numpy_ndarray(small)}),
                 tmp_path / "in.parquet")  # fmt: skip
    cfg = job_config(tmp_path / "out", [path], **{"model.name": str(tmp_path / "smoother.onnx")})
    with pytest.raises(BulkinferError) as err:
        run_job(cfg)
    assert "model input 'grid' takes rows of 1x8x8; column 'grid' holds rows of 1x6x6" in str(err.value)
    assert "\n" not in str(err.value)
