"""LanceDB export: each committed part's rows merged by id into a Lance table (embedded: a
folder or an object-store URI; made when missing, with the vector as fixed-size float32 lists),
and the vector index the config names built when the job completes.

A merge on the id (update when matched, insert when not) makes a replayed part (a crash between
the export and the ledger line) change nothing: every id is in the table once. A table the run
itself made (empty when made) takes its parts by plain appends, twice as fast: within one run no
part is written twice, and a resumed run finds the table there and merges. An existing table
must have the id column and a vector of the output's dimension; anything else is refused before
the first row is sent to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..core.credentials import redact_url
from ..core.errors import ConfigError, OutputError
from ..core.faults import crash_point
from .exports import float32_vectors, id_setting, vector_layout

if TYPE_CHECKING:
    from ..config import LanceDBExport
    from ..plan import JobPlan

__all__ = ["LanceDBTarget"]

log = logging.getLogger("bulkinfer")

INDEX_MIN_ROWS = 256
"""Fewer rows than this cannot train an IVF index's partitions: the table is left to exact search."""


class LanceDBTarget:
    def __init__(self, spec: LanceDBExport, where: str) -> None:
        if not spec.uri:
            raise ConfigError(f"{where}.uri: no LanceDB database (a folder, or an object-store URI)")
        self.spec = spec
        self.where = where
        self.name = f"{where} (lancedb table {spec.table} at {redact_url(spec.uri)})"
        self.db: Any = None
        self.table: Any = None
        self.kept: list[str] = []
        self.id_column = ""
        self.layout: tuple[str, list[str]] | None = None
        self._checked = False
        self._fresh = False  # the table was made by this run: parts are appended, not merged

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        try:
            import lancedb
        except ImportError as exc:
            raise ConfigError(
                f"{self.where}: the lancedb export needs lancedb: pip install 'bulkinfer[vectors]'"
            ) from exc
        self.kept, self.id_column = list(kept), id_setting(plan, self.where)
        try:
            self.db = lancedb.connect(self.spec.uri, storage_options=self.spec.storage_options or None)
            if self.spec.table in self.db.list_tables().tables:
                self.table = self.db.open_table(self.spec.table)
        except (OSError, ValueError, RuntimeError) as exc:
            raise OutputError(f"{self.name}: cannot open ({' '.join(str(exc).split())[:200]})") from exc
        if self.table is not None and self.id_column not in self.table.schema.names:
            raise OutputError(
                f"{self.name}: the table has no column {self.id_column!r} (source.id_column); choose another table"
            )

    def write(self, part: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.layout is None:
            self.layout = vector_layout(table, self.spec.vector, self.spec.columns, self.kept, self.where)
        vector, scalars = self.layout
        rows = pa.table(
            {self.id_column: table.column(self.id_column), vector: float32_vectors(table.column(vector)),
             **{c: table.column(c) for c in scalars}}
        )  # fmt: skip
        if self.table is None:
            self.table = self.db.create_table(self.spec.table, schema=rows.schema, exist_ok=True)
            self._fresh = len(self.table.schema) == rows.num_columns and self.table.count_rows() == 0
        if not self._checked:
            self._check(rows.schema, vector)
            self._checked = True
        try:
            if self._fresh:  # a table this run made: no part of it is there twice, appends are enough
                self.table.add(rows)
            else:
                self.table.merge_insert(self.id_column).when_matched_update_all().when_not_matched_insert_all().execute(
                    rows
                )
        except (OSError, ValueError, RuntimeError) as exc:
            raise OutputError(f"{self.name}: writing {part}: {' '.join(str(exc).split())[:300]}") from exc
        crash_point("export-lancedb-written")

    def complete(self) -> None:
        if self.table is None or self.spec.index == "none" or self.layout is None:
            return
        rows = self.table.count_rows()
        if rows < INDEX_MIN_ROWS:
            log.warning("%s: %d rows are too few to train %s (%d at least); searches are exact",
                        self.name, rows, self.spec.index, INDEX_MIN_ROWS)  # fmt: skip
            return
        self.table.create_index(metric=self.spec.metric, vector_column_name=self.layout[0], index_type=self.spec.index,
                                num_partitions=max(1, min(256, rows // 4096)), replace=True)  # fmt: skip

    def close(self) -> None:
        self.db = self.table = None

    def _check(self, schema: pa.Schema, vector: str) -> None:
        """The table there against the rows: each column present, the vector of the same dimension."""
        have = self.table.schema
        theirs, ours = have.field(vector).type if vector in have.names else None, schema.field(vector).type
        if theirs is None or not pa.types.is_fixed_size_list(theirs) or theirs.list_size != ours.list_size:
            size = theirs.list_size if theirs is not None and pa.types.is_fixed_size_list(theirs) else "no fixed"
            raise OutputError(
                f"{self.name}: the table's {vector!r} has {size} dimensions, the output's {ours.list_size}; "
                "choose another table or drop it"
            )
        for f in schema:
            if f.name not in have.names:
                raise OutputError(
                    f"{self.name}: the table has no column {f.name!r}; set columns or choose another table"
                )
