"""Precomputed results: look rows of a finished offline run up by id.

At start-up the id column of every committed part (from the run's ``_SUCCESS`` manifest)
is read into an index ``id -> (part, row)``; a lookup reads that one row (the part is
memory-mapped, the last few are kept open). Only Parquet output is indexed.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ConfigError

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
        files = [f["name"] for f in json.loads(manifest.read_text())["files"]]
        if any(not name.endswith(".parquet") for name in files):
            raise ConfigError(
                f"serve.results: {self.out_dir} is not Parquet output; only Parquet runs can be looked up"
            )
        if not id_column:
            raise ConfigError("serve.results: set source.id_column (--id-column) to the run's id column")
        self.id_column = id_column
        self.files = files
        self.index: dict[str, tuple[int, int]] = {}
        for i, name in enumerate(files):
            ids = pq.read_table(self.out_dir / name, columns=[id_column]).column(id_column).to_pylist()
            for row, value in enumerate(ids):
                self.index[str(value)] = (i, row)
        self._open: OrderedDict[int, pa.Table] = OrderedDict()
        first = next(iter(self.index), None)
        sample = self.get(first) if first is not None else None
        self.id_type = type(sample[id_column]) if sample else str

    def parse_id(self, key: str) -> Any:
        """``key`` (from a URL) as the id column's type, for a row computed live."""
        try:
            return self.id_type(key)
        except (TypeError, ValueError):
            return key

    def __len__(self) -> int:
        return len(self.index)

    def get(self, key: str) -> dict[str, Any] | None:
        """The output row for ``key``, or None."""
        where = self.index.get(key)
        if where is None:
            return None
        part, row = where
        table = self._open.pop(part, None)
        if table is None:
            table = pq.read_table(self.out_dir / self.files[part], memory_map=True)
        self._open[part] = table
        while len(self._open) > _OPEN_PARTS:
            self._open.popitem(last=False)
        rows: list[dict[str, Any]] = table.slice(row, 1).to_pylist()
        return rows[0]
