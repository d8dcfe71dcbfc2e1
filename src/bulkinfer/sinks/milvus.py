"""Milvus export: each committed part's rows upserted by id into a collection (made when missing,
with the vector's dimension and the index type the config names), through ``pymilvus``'
``MilvusClient``: a Milvus server, or a local file that Milvus Lite serves in this process.

An upsert by primary key makes a replayed part (a crash between the export and the ledger
line) change nothing: every id is in the collection once. An existing collection must have the
id as its primary key and a vector field of the output's dimension; anything else is refused
before the first row is sent to it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..core.credentials import redact_url
from ..core.errors import ConfigError, OutputError
from ..core.faults import crash_point
from .exports import id_setting, is_vector, retrying, vector_layout, vectors

if TYPE_CHECKING:
    from ..config import MilvusExport
    from ..plan import JobPlan

__all__ = ["MilvusTarget"]

VARCHAR_MAX = 65_535
"""Milvus' longest VARCHAR: the id and text columns are declared with it."""


class MilvusTarget:
    def __init__(self, spec: MilvusExport, where: str) -> None:
        if not spec.uri:
            raise ConfigError(f"{where}.uri: no Milvus (http://host:19530, or a local file such as items.db)")
        self.spec = spec
        self.where = where
        self.name = f"{where} (milvus collection {spec.collection} at {redact_url(spec.uri)})"
        self.client: Any = None
        self.kept: list[str] = []
        self.id_column = ""
        self.layout: tuple[str, list[str]] | None = None  # (vector, scalars) once the collection is checked

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        try:
            from pymilvus import MilvusClient, MilvusException
        except ImportError as exc:
            raise ConfigError(
                f"{self.where}: the milvus export needs pymilvus: pip install 'bulkinfer[vectors]'"
            ) from exc
        self._errors = (MilvusException,)
        self.kept, self.id_column = list(kept), id_setting(plan, self.where)
        try:
            self.client = MilvusClient(uri=self.spec.uri, token=os.environ.get("MILVUS_TOKEN", ""), timeout=10)
            exists = self.client.has_collection(self.spec.collection)
        except MilvusException as exc:
            raise OutputError(f"{self.name}: cannot connect ({' '.join(str(exc).split())[:200]})") from exc
        if exists:
            fields = self._fields()
            primary = next((f["name"] for f in fields if f.get("is_primary")), None)
            if primary != self.id_column:
                raise OutputError(
                    f"{self.name}: the collection's primary key is {primary!r}, not source.id_column "
                    f"{self.id_column!r}; choose another collection or drop it"
                )

    def write(self, part: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.layout is None:
            self.layout = vector_layout(table, self.spec.vector, self.spec.columns, self.kept, self.where)
            self._collection(table, *self.layout)
        vector, scalars = self.layout
        matrix = vectors(table.column(vector))
        values = {c: table.column(c).to_pylist() for c in [self.id_column, *scalars]}
        names = list(values)
        rows = [
            {**dict(zip(names, row, strict=True)), vector: matrix[i]}
            for i, row in enumerate(zip(*values.values(), strict=True))
        ]
        step = self.spec.batch_rows
        for at in range(0, len(rows), step):
            self._upsert(part, rows[at : at + step])
            crash_point("export-milvus-upserted")

    def _upsert(self, part: str, batch: list[dict[str, Any]]) -> None:
        what = f"{self.name}: upserting {part}"
        retrying(lambda: self.client.upsert(self.spec.collection, batch), what, self._errors)

    def complete(self) -> None:
        if self.client is not None and self.layout is not None:
            retrying(lambda: self.client.flush(self.spec.collection), f"{self.name}: flushing", self._errors)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    # -- the collection ----------------------------------------------------------------
    def _fields(self) -> list[dict[str, Any]]:
        return list(self.client.describe_collection(self.spec.collection)["fields"])

    def _collection(self, table: pa.Table, vector: str, scalars: list[str]) -> None:
        """Make the collection for these columns, or check the one there before any row is sent."""
        dim = vectors(table.column(vector)[:1]).shape[1]
        if self.client.has_collection(self.spec.collection):
            self._check(table, vector, dim, scalars)
            return
        from pymilvus import DataType, MilvusClient

        key = self._type(table, self.id_column)
        if key not in (DataType.INT64, DataType.VARCHAR):
            raise OutputError(f"{self.name}: a Milvus primary key is an integer or a string; {self.id_column!r} is not")
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(self.id_column, key, is_primary=True, **_sized(table, self.id_column))
        schema.add_field(vector, DataType.FLOAT_VECTOR, dim=dim)
        for c in scalars:
            schema.add_field(c, self._type(table, c), nullable=True, **_sized(table, c))
        index = self.client.prepare_index_params()
        index.add_index(field_name=vector, index_type=self.spec.index, metric_type=self.spec.metric)
        self.client.create_collection(self.spec.collection, schema=schema, index_params=index)

    def _check(self, table: pa.Table, vector: str, dim: int, scalars: list[str]) -> None:
        fields = {f["name"]: f for f in self._fields()}
        have = fields.get(vector, {})
        have_dim = int(have.get("params", {}).get("dim", 0) or 0)
        if have_dim != dim:
            what = f"a vector of {have_dim} dimensions" if have_dim else "no vector field"
            raise OutputError(
                f"{self.name}: the collection has {what} named {vector!r}; the output's has {dim}; "
                "choose another collection or drop it"
            )
        missing = [c for c in scalars if c not in fields]
        if missing:
            raise OutputError(
                f"{self.name}: the collection has no field {missing[0]!r}; set columns to the fields it has "
                f"({', '.join(n for n in fields if n not in (vector, self.id_column))}) or choose another collection"
            )

    def _type(self, table: pa.Table, column: str) -> Any:
        from pymilvus import DataType

        t = table.schema.field(column).type
        if pa.types.is_boolean(t):
            return DataType.BOOL
        if pa.types.is_integer(t):
            return DataType.INT64
        if pa.types.is_floating(t):
            return DataType.DOUBLE
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return DataType.VARCHAR
        hint = "name one vector in vector" if is_vector(table.column(column)) else "leave it out of columns"
        raise OutputError(f"{self.name}: cannot store column {column!r} ({t}) in Milvus; {hint}")


def _sized(table: pa.Table, column: str) -> dict[str, int]:
    t = table.schema.field(column).type
    return {"max_length": VARCHAR_MAX} if pa.types.is_string(t) or pa.types.is_large_string(t) else {}
