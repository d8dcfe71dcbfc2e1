"""Precomputed results: look rows of a finished offline run up by id.

At start-up the id column of every committed part (from the run's ``_SUCCESS`` manifest)
is read and sorted by Arrow (the ids stay in Arrow memory, about their own size plus 8
bytes a row: tens of millions of ids fit where a Python dict would take gigabytes); a
lookup is a binary search, then reads that one row (the part is memory-mapped, the last
few are kept open). Only Parquet output is indexed.
"""

from __future__ import annotations

import bisect
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core.errors import ConfigError
from ..core.layout import result_columns
from ..core.storage import file_version

__all__ = ["ResultIndex"]

_OPEN_PARTS = 4


class ResultIndex:
    """``id -> output row`` over a finished run's parts."""

    def __init__(self, out_dir: str | Path, id_column: str | None) -> None:
        self.out_dir = Path(out_dir).expanduser()
        manifest = self.out_dir / "_SUCCESS"
        if not manifest.is_file():
            raise ConfigError(
                f"serve.results: {self.out_dir} holds no finished run (no _SUCCESS); finish the run first"
            )
        self.stamp = file_version(manifest)
        files = [f["name"] for f in json.loads(manifest.read_text())["files"]]
        if any(not name.endswith(".parquet") for name in files):
            raise ConfigError(
                f"serve.results: {self.out_dir} is not Parquet output; only Parquet runs can be looked up"
            )
        if not id_column:
            raise ConfigError("serve.results: set source.id_column (--id-column) to the run's id column")
        self.id_column = id_column
        self.files = files
        columns = [pq.read_table(self.out_dir / name, columns=[id_column]).column(id_column) for name in files]
        self.starts = np.cumsum([0, *(len(c) for c in columns)])  # each part's first global position
        ids = pa.concat_arrays([c.combine_chunks() for c in columns]) if columns else pa.array([], pa.string())
        self.numeric = pa.types.is_integer(ids.type)
        if not self.numeric:
            ids = ids.cast(pa.string())  # ids arrive as URL text
        order = pc.sort_indices(ids).slice(0, len(ids) - ids.null_count)  # nulls sort last
        self.sorted_ids = ids.take(order)
        self.positions = order.to_numpy()
        self.id_type = int if self.numeric else str
        self._open: OrderedDict[int, pa.Table] = OrderedDict()

    def parse_id(self, key: str) -> Any:
        """``key`` (from a URL) as the id column's type, for a row computed live."""
        try:
            return self.id_type(key)
        except (TypeError, ValueError):
            return key

    def __len__(self) -> int:
        return len(self.sorted_ids)

    def newer(self) -> ResultIndex | None:
        """The same folder indexed again if a later run finished there since, else None."""
        manifest = self.out_dir / "_SUCCESS"
        if not manifest.is_file() or file_version(manifest) == self.stamp:
            return None
        return ResultIndex(self.out_dir, self.id_column)

    def describe(self) -> str:
        return f"the {len(self)} precomputed rows of {self.out_dir}"

    def get(self, key: str) -> dict[str, Any] | None:
        """The output row for ``key``, or None."""
        value = self.parse_id(key)
        if self.numeric and not isinstance(value, int):
            return None
        at = bisect.bisect_left(self.sorted_ids, value, key=lambda scalar: scalar.as_py())
        if at == len(self.sorted_ids) or self.sorted_ids[at].as_py() != value:
            return None
        position = int(self.positions[at])
        part = int(np.searchsorted(self.starts, position, side="right")) - 1
        row = position - int(self.starts[part])
        table = self._open.pop(part, None)
        if table is None:
            table = pq.read_table(self.out_dir / self.files[part], memory_map=True)
        self._open[part] = table
        while len(self._open) > _OPEN_PARTS:
            self._open.popitem(last=False)
        rows: list[dict[str, Any]] = table.slice(row, 1).select(result_columns(table.column_names)).to_pylist()
        return rows[0]
