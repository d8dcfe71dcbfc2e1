"""Tensor columns to and from numpy (:mod:`bulkinfer.core.tensors`), and the reader's guard
against Arrow's ``take`` of a sliced nested fixed-size list (it returned other rows)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.core.errors import ModelError
from bulkinfer.core.tensors import column_array, nested_lists, tensor_column, unsliced


def _nested(grids: np.ndarray) -> pa.Array:
    flat = pa.array(grids.ravel())
    for size in reversed(grids.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def test_every_way_of_holding_a_tensor_reads_as_one_array():
    grids = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    forms = [pa.FixedShapeTensorArray.from_numpy_ndarray(grids), _nested(grids), pa.array(grids.tolist())]
    for column in forms:
        np.testing.assert_array_equal(column_array(column, "g"), grids)
        np.testing.assert_array_equal(column_array(pa.chunked_array([column.slice(0, 1), column.slice(1)]), "g"), grids)
    assert column_array(pa.array([1, 2, 3]), "n", np.float32).dtype == np.float32


def test_unequal_rows_and_missing_rows_are_named():
    with pytest.raises(ModelError, match=r"^column 'v': a row holds 1 values where the first held 2"):
        column_array(pa.array([[1.0, 2.0], [3.0, 4.0], [5.0]]), "v")
    with pytest.raises(ModelError, match=r"^column 'v': a row holds 3 values \(dimension 2\) where the first held 2"):
        column_array(pa.array([[[1, 2]], [[3, 4, 5]]]), "v")
    with pytest.raises(ModelError, match=r"^column 'v': row 1 holds no array"):
        column_array(pa.array([[1.0], None]), "v")


def test_outputs_by_rank_and_their_text_form():
    assert tensor_column(np.arange(3.0)).type == pa.float64()
    assert pa.types.is_fixed_size_list(tensor_column(np.zeros((3, 4), np.float32)).type)
    cube = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    column = tensor_column(cube)
    assert isinstance(column.type, pa.FixedShapeTensorType) and column.type.shape == [3, 4]
    assert nested_lists(column).to_pylist() == cube.tolist()


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 3), min_size=2, max_size=3),
    rows=st.integers(2, 12),
    data=st.data(),
)
def test_a_slice_of_nested_lists_takes_the_rows_it_should(shape, rows, data):
    start = data.draw(st.integers(0, rows - 1))
    nulls = data.draw(st.sets(st.integers(0, rows - 1)))
    values = np.arange(rows * int(np.prod(shape)), dtype=np.float32).reshape(rows, *shape)
    expected = [None if i in nulls else values[i].tolist() for i in range(rows)]
    column = pa.array(expected, _nested(values).type)
    batch = unsliced(pa.record_batch({"t": column, "i": np.arange(rows)}).slice(start))
    take = data.draw(st.lists(st.integers(0, rows - start - 1), max_size=6))
    assert batch.column(0).take(pa.array(take, pa.int64())).to_pylist() == [expected[start + j] for j in take]
    assert batch.column(1).to_pylist() == list(range(start, rows))
