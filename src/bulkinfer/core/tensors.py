"""Tensor columns: a table column whose rows are arrays, to and from an N-d numpy batch.

A row's array may be held three ways: Arrow's ``fixed_shape_tensor`` extension type (the
canonical one: shape in the type, row-major storage), fixed-size lists nested one per
dimension (``fixed_size_list<fixed_size_list<float>[4]>[3]``: a 3 × 4 array a row), or plain
lists all of one shape (what a JSONL file gives). :func:`column_array` reads any of them as
one ``(rows, *shape)`` array; :func:`tensor_column` writes a model's N-d output back as a
``fixed_shape_tensor`` column (Parquet keeps the type; a 2-D output stays a fixed-size list,
as embeddings are).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .errors import ModelError

__all__ = ["column_array", "nested_lists", "tensor_column", "unsliced"]


def _flat(column: pa.Array) -> pa.Array:
    while pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        column = column.flatten()
    return column


def _list_shape(column: pa.Array, name: str) -> list[int]:
    """The one shape of every row of a (nested) list column; a row of another shape is refused."""
    shape: list[int] = []
    level = column
    while pa.types.is_list(level.type) or pa.types.is_fixed_size_list(level.type):
        lengths = level.value_lengths().to_numpy(zero_copy_only=False) if pa.types.is_list(level.type) else None
        size = level.type.list_size if lengths is None else (int(lengths[0]) if len(lengths) else 0)
        if lengths is not None and (lengths != size).any():
            row = int(np.flatnonzero(lengths != size)[0])
            depth = f" (dimension {len(shape) + 1})" if shape else ""
            raise ModelError(
                f"column {name!r}: a row holds {int(lengths[row])} values{depth} where the first held {size}; "
                "a tensor column's rows must all have one shape"
            )
        shape.append(size)
        level = level.flatten()
    return shape


def column_array(column: pa.Array | pa.ChunkedArray, name: str, dtype: np.dtype | type | None = None) -> np.ndarray:
    """``column`` as one numpy array: ``(rows,)`` for scalars, ``(rows, *shape)`` for a tensor column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column.type, pa.FixedShapeTensorType):
        values = column.to_numpy_ndarray()
    elif pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise ModelError(f"column {name!r}: row {row} holds no array; a tensor column's rows must all hold one")
        shape = _list_shape(column, name)
        values = _flat(column).to_numpy(zero_copy_only=False).reshape(len(column), *shape)
    else:
        values = column.to_numpy(zero_copy_only=False)
    return values if dtype is None else values.astype(dtype, copy=False)


def tensor_column(values: np.ndarray) -> pa.Array:
    """A model's ``(rows, *shape)`` output as a column: 1-D plain, 2-D fixed-size lists, more ``fixed_shape_tensor``."""
    if values.ndim <= 1:
        return pa.array(values)
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(values).ravel()), values.shape[1])
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))


def nested_lists(column: pa.Array) -> pa.Array:
    """A ``fixed_shape_tensor`` column as fixed-size lists nested one per dimension (what JSON and
    CSV write: a 3 × 4 array a row as three lists of four, not twelve values); any other as is."""
    if not isinstance(column.type, pa.FixedShapeTensorType):
        return column
    nested = column.storage.flatten()
    for size in reversed(column.type.shape):
        nested = pa.FixedSizeListArray.from_arrays(nested, size)
    return nested


def _nested_fixed(kind: pa.DataType) -> list[int] | None:
    """The sizes of a fixed-size list of fixed-size lists (outermost first); None for any other type."""
    sizes = []
    while pa.types.is_fixed_size_list(kind):
        sizes.append(kind.list_size)
        kind = kind.value_type
    return sizes if len(sizes) > 1 else None


def unsliced(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each column of nested fixed-size lists that starts inside its buffers
    (a slice: a shard that begins inside a row group) rebuilt to start at 0. Arrow 26's ``take``
    of such a slice counts the offset twice and returns other rows, silently; every later step
    (batches, order, kept columns) takes rows, so the reader hands on none."""
    columns = list(batch.columns)
    for i, column in enumerate(columns):
        sizes = _nested_fixed(column.type)
        if sizes is None or column.offset == 0:
            continue
        rebuilt = column
        for size in sizes:  # down to the values, null rows' slots kept (flatten() drops them)
            rebuilt = rebuilt.values.slice(rebuilt.offset * size, len(rebuilt) * size)
        for depth, size in enumerate(reversed(sizes)):
            outer = depth == len(sizes) - 1
            mask = column.is_null() if outer and column.null_count else None
            rebuilt = pa.FixedSizeListArray.from_arrays(rebuilt, size, mask=mask)
        columns[i] = rebuilt.cast(column.type)  # the field names of the nested lists, as read
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)
