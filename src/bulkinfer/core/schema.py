"""One type per input column for the whole job, so every output part has the same schema.

CSV and JSONL carry no types: pyarrow infers them from what it reads, and two shards (or
two files) can disagree — ``price`` is int64 where the first block holds ``10`` and
double where it holds ``10.5`` — which leaves parts that ``pyarrow.dataset`` and pandas
cannot read together. The job therefore settles each column's type before it runs:
:func:`unify` merges the types the files start with (Parquet's footer, the first MiB of
a CSV or JSONL file), widening int to double and anything else that disagrees to
string; ``source.column_types`` overrides. Readers then convert to those types, and a
value that does not fit becomes an error row naming the column (:func:`convert_rows`),
not a failed file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["convert_rows", "fit_value", "parse_type", "type_name", "unify"]


def unify(types: Iterable[pa.DataType]) -> pa.DataType | None:
    """The one type values of all ``types`` fit: the same, int/float widened to double,
    string otherwise; None when nothing is known (only null-typed columns)."""
    known = {t for t in types if not pa.types.is_null(t)}
    if not known:
        return None
    if len(known) == 1:
        return known.pop()
    if all(pa.types.is_integer(t) for t in known):
        return pa.int64()
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in known):
        return pa.float64()
    return pa.string()


def type_name(t: pa.DataType) -> str | None:
    """``t`` as a name :func:`parse_type` reads back (``source.column_types``), or None."""
    name = str(t)
    try:
        return name if parse_type(name) == t else None
    except ValueError:
        return None


def parse_type(name: str) -> pa.DataType:
    """An Arrow type from its name: string, int64, double, bool, date32, timestamp[us]..."""
    try:
        return pa.type_for_alias(name)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"unknown type {name!r} (use an Arrow type name: string, int64, double, bool...)") from exc


def fit_value(value: Any, target: pa.DataType) -> Any:
    """A parsed JSON value as ``target`` (a number or boolean in a string column becomes its
    JSON text); ValueError when it does not fit."""
    if value is None:
        return None
    if pa.types.is_string(target) or pa.types.is_large_string(target):
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(value, bool) != pa.types.is_boolean(target) or isinstance(value, dict | list):
        raise ValueError(f"{type(value).__name__} is not {target}")
    try:
        return pa.scalar(value).cast(target).as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ValueError(f"{value!r} is not {target}") from exc


def convert_rows(
    table: pa.Table, types: Mapping[str, pa.DataType], rows: np.ndarray, bad: Callable[[int, str], None]
) -> tuple[pa.Table, np.ndarray]:
    """Cast ``table``'s columns to ``types``; rows with a value that does not fit go to
    ``bad(row, message)`` (``rows`` are their numbers) and are dropped."""
    keep = np.ones(table.num_rows, dtype=bool)
    columns = {}
    for name in table.column_names:
        target = types.get(name)
        column = table.column(name)
        if target is None or column.type == target:
            continue
        try:
            columns[name] = column.cast(target)
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        values: list[Any] = []
        for i, value in enumerate(column.to_pylist()):
            try:
                values.append(None if value is None else pa.scalar(value).cast(target).as_py())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                if keep[i]:
                    keep[i] = False
                    bad(
                        int(rows[i]),
                        f"column {name!r}: {value!r} is not {target} (the column's type in this job; "
                        "fix the value or set source.column_types)",
                    )
                values.append(None)
        columns[name] = pa.array(values, type=target)
    for name, column in columns.items():
        table = table.set_column(table.column_names.index(name), name, column)
    if keep.all():
        return table, rows
    return table.filter(pa.array(keep)), rows[keep]
