"""Columns and their types across files: the needed columns must be there, and each gets
one type (see :mod:`bulkinfer.core.schema`) read from the files' heads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from ..core.errors import SourceError
from ..core.schema import unify
from .registry import get_format
from .shard import InputFile

__all__ = ["check_columns", "head_schema", "settle_types"]


def head_schema(f: InputFile) -> pa.Schema:
    """The columns a file starts with and their types, read cheaply: Parquet's footer, the
    first MiB of a CSV as pyarrow infers it, the first MiB of JSONL lines. Empty when the
    file cannot be read (planning reports that)."""
    if f.unreadable is not None:
        return pa.schema([])
    try:
        return get_format(f.format).head_schema(f)
    except (pa.ArrowInvalid, OSError, ValueError, SourceError):
        return pa.schema([])


def check_columns(heads: Mapping[str, pa.Schema], columns: Sequence[str]) -> None:
    """Refuse up front when a needed column is in none of the files' heads (``{uri:
    head_schema}``): a config mistake, not bad data."""
    readable = {uri: schema for uri, schema in heads.items() if schema.names}
    # files whose head could not be read are planning's to explain (each named, with why)
    for col in columns:
        if readable and not any(col in schema.names for schema in readable.values()):
            uri, schema = next(iter(readable.items()))
            others = f" and the {len(readable) - 1} other readable file(s)" if len(readable) > 1 else ""
            raise SourceError(
                f"column {col!r} is not in {uri}{others} (it has {', '.join(schema.names)}); "
                "check the column name (--text-column, --feature-columns, --id-column)",
                uri,
            )


def settle_types(heads: Iterable[pa.Schema], columns: Sequence[str]) -> dict[str, pa.DataType]:
    """Each column's one type across the files whose heads are given (see :mod:`.schema`)."""
    schemas = list(heads)
    types = {}
    for col in columns:
        t = unify(schema.field(col).type for schema in schemas if col in schema.names)
        if t is not None:
            types[col] = t
    return types
