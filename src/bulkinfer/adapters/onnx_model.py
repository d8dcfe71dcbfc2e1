"""Any ``.onnx`` file a user brings (a converted scikit-learn pipeline, an exported network).

Inputs are fed from columns: a model with one 2-D input gets the feature columns stacked
into one matrix (``model.feature_columns``, in order; one column of vectors is the matrix);
otherwise each input takes the column of its own name, or the one ``model.options = {inputs =
{name = "column"}}`` maps to it: a scalar column feeds a ``(N,)`` or ``(N, 1)`` input, a tensor
column (Arrow's ``fixed_shape_tensor``, nested fixed-size lists, or lists of one shape:
:mod:`bulkinfer.core.tensors`) an ``(N, *shape)`` one. Each output becomes a column of its own
name (2-D outputs fixed-size lists, more dimensions a ``fixed_shape_tensor`` column), or
``model.options = {outputs = {name = "column"}}`` renames them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError, ModelError
from ..core.tensors import column_array
from .protocol import Adapter, SetupContext

__all__ = ["OnnxAdapter"]

_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


class OnnxAdapter(Adapter):
    """Runs an ONNX model with ONNX Runtime over named columns."""

    def __init__(
        self, model_path: str | Path, feature_columns: Sequence[str] = (), options: Mapping[str, Any] | None = None
    ) -> None:
        self.model_path = Path(model_path)
        opts = dict(options or {})
        self.input_map: dict[str, str] = dict(opts.get("inputs", {}))
        self.output_map: dict[str, str] = dict(opts.get("outputs", {}))
        self.feature_columns = list(feature_columns)
        self._session: Any = None
        self._inputs: list[tuple[str, Any, list[Any]]] = []
        self._describe()

    def _describe(self) -> None:
        import onnxruntime as ort

        try:
            session = ort.InferenceSession(str(self.model_path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"{self.model_path}: not a loadable ONNX model ({exc})") from exc
        self._inputs = [(i.name, _NUMPY.get(i.type, np.float32), list(i.shape)) for i in session.get_inputs()]
        stacked = len(self._inputs) == 1 and len(self._inputs[0][2]) == 2 and not self.input_map
        if stacked:
            if not self.feature_columns:
                raise ConfigError(
                    f"model.feature_columns: {self.model_path.name} takes one matrix; list the "
                    "columns that fill it, in order, with --feature-columns a,b,c"
                )
            self.input_columns = tuple(self.feature_columns)
        else:
            self.input_columns = tuple(self.input_map.get(name, name) for name, _t, _s in self._inputs)
        self._stacked = stacked

    @property
    def one_matrix(self) -> bool:
        """Whether the model takes one 2-D input (a matrix of features)."""
        return bool(self._stacked)

    def matrix_width(self) -> int | None:
        """The fixed width of a one-matrix model's input (None: not one matrix, or not fixed)."""
        if not self._stacked:
            return None
        width = self._inputs[0][2][1]
        return width if isinstance(width, int) else None

    def setup(self, ctx: SetupContext) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = ctx.threads
        if ctx.online:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(self.model_path), so, providers=["CPUExecutionProvider"])

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        feeds: dict[str, np.ndarray] = {}
        if self._stacked:
            name, dtype, _shape = self._inputs[0]
            cols = [column_array(batch.column(c), c, dtype) for c in self.feature_columns]
            feeds[name] = cols[0] if len(cols) == 1 and cols[0].ndim == 2 else np.column_stack(cols)
        else:
            for name, dtype, shape in self._inputs:
                column = self.input_map.get(name, name)
                feeds[name] = _fitted(column_array(batch.column(column), column, dtype), name, shape, column)
        names = [o.name for o in self._session.get_outputs()]
        outputs = self._session.run(names, feeds)
        result: dict[str, Any] = {}
        for name, value in zip(names, outputs, strict=True):
            arr = np.asarray(value)
            if arr.ndim == 2 and arr.shape[1] == 1:
                arr = arr[:, 0]
            result[self.output_map.get(name, name)] = arr
        return result


def _fitted(values: np.ndarray, name: str, shape: list[Any], column: str) -> np.ndarray:
    """``values`` shaped for the input ``name`` of ``shape`` (a scalar column into ``(N, 1)``);
    a column whose rows have another rank or another fixed size is one line naming both."""
    if values.ndim == len(shape) - 1:
        values = values.reshape(*values.shape, 1)
    fixed = [(i, d) for i, d in enumerate(shape) if isinstance(d, int) and i > 0]
    if values.ndim != len(shape) or any(values.shape[i] != d for i, d in fixed):
        want = "x".join(str(d) if isinstance(d, int) else "?" for d in shape[1:]) or "one value"
        got = "x".join(map(str, values.shape[1:])) or "one value"
        raise ModelError(f"model input {name!r} takes rows of {want}; column {column!r} holds rows of {got}")
    return values
