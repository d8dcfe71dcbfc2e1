"""A user's own .onnx file, built here with the onnx helper API and run by ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bulkinfer import ConfigError, run_job

from helpers import job_config, read_output, tabular_table, write

W = np.array([[0.5], [-1.0], [2.0]], dtype=np.float32)


def _linear(path):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])
    score = helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N", 1])
    double = helper.make_tensor_value_info("double", TensorProto.FLOAT, ["N", 3])
    nodes = [helper.make_node("MatMul", ["X", "W"], ["score"]), helper.make_node("Add", ["X", "X"], ["double"])]
    graph = helper.make_graph(nodes, "linear", [x], [score, double], [numpy_helper.from_array(W, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _adder(path):
    a = helper.make_tensor_value_info("a", TensorProto.DOUBLE, ["N"])
    b = helper.make_tensor_value_info("b", TensorProto.DOUBLE, ["N"])
    out = helper.make_tensor_value_info("sum", TensorProto.DOUBLE, ["N"])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["sum"])], "adder", [a, b], [out])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _cfg(tmp_path, **extra):
    return job_config(tmp_path / "out", [tmp_path / "in.parquet"], **{"source.shard_rows": 200, **extra})


def test_one_matrix_input_from_feature_columns(tmp_path):
    t = tabular_table(500)
    write(t, tmp_path / "in.parquet")
    _linear(tmp_path / "linear.onnx")
    with pytest.raises(ConfigError, match="feature_columns"):
        run_job(_cfg(tmp_path, **{"model.name": str(tmp_path / "linear.onnx")}))
    run_job(
        _cfg(tmp_path, **{"model.name": str(tmp_path / "linear.onnx"), "model.feature_columns": ["x1", "x2", "x3"]})
    )
    out = read_output(tmp_path / "out")
    x = np.column_stack([t[c].to_numpy() for c in ("x1", "x2", "x3")]).astype(np.float32)
    assert out.column_names == ["id", "score", "double", "_input_hash"] and out["id"].to_pylist() == list(range(500))
    np.testing.assert_allclose(out["score"].to_numpy(), (x @ W)[:, 0], rtol=1e-6)
    np.testing.assert_allclose(np.stack(out["double"].to_numpy(zero_copy_only=False)), 2 * x)


def test_named_inputs_and_outputs_are_mapped_from_options(tmp_path):
    t = tabular_table(300)
    write(t, tmp_path / "in.parquet")
    _adder(tmp_path / "adder.onnx")
    run_job(
        _cfg(
            tmp_path,
            **{
                "model.name": str(tmp_path / "adder.onnx"),
                "model.options": {"inputs": {"a": "x1", "b": "x2"}, "outputs": {"sum": "total"}},
            },
        )
    )
    out = read_output(tmp_path / "out")
    assert out.column_names == ["id", "total", "_input_hash"]
    np.testing.assert_array_equal(out["total"].to_numpy(), t["x1"].to_numpy() + t["x2"].to_numpy())
