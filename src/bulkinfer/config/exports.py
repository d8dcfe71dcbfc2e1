"""``[[export]]`` targets (one model per kind, told apart by ``kind``) and ``[[route]]`` tables."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator

from ..core.errors import ConfigError
from .section import Section


class RedisExport(Section):
    kind: Literal["redis"] = "redis"
    url: str = "redis://127.0.0.1:6379/0"
    """Redis to write to (redis://[:password@]host:port/db, rediss:// for TLS)."""
    key: str = "bulkinfer:{id}"
    """Key of each row: text and {column} placeholders (output or kept input columns)."""
    columns: list[str] = Field(default_factory=list)
    """Output columns to store (default: every model output column)."""
    encoding: Literal["auto", "float32", "json", "hash"] = "auto"
    """auto: one vector column as float32 bytes, one scalar as text, several as a hash; json: one JSON object."""
    ttl_s: int | None = Field(default=None, ge=1)
    """Expire each key this many seconds after it is written (None: never)."""
    versioned: bool = True
    """Write under the run's own version and switch '<prefix>current' to it when the job completes."""
    keep_versions: int = Field(default=2, ge=1)
    """Published versions kept (the current one included); older ones are deleted after a switch."""
    batch_rows: int = Field(default=2000, ge=1)
    """Rows per pipelined round trip."""


class PostgresExport(Section):
    kind: Literal["postgres"] = "postgres"
    dsn: str = ""
    """Connection string (postgresql://user:pass@host:port/db)."""
    table: str = "bulkinfer_results"
    """Table to write (schema.table allowed); created when missing."""
    mode: Literal["upsert", "append"] = "upsert"
    """upsert: one row per id (the id column is the primary key); append: rows are added."""
    columns: list[str] = Field(default_factory=list)
    """Output columns to store besides the kept input columns (default: every model output column)."""
    vector: Literal["auto", "pgvector", "array"] = "auto"
    """Embeddings as pgvector vector(n) (auto: when the extension can be used) or real[]."""


class RedisStreamExport(Section):
    kind: Literal["redis_stream"] = "redis_stream"
    url: str = "redis://127.0.0.1:6379/0"
    """Redis to write to (redis://[:password@]host:port/db, rediss:// for TLS)."""
    stream: str = "bulkinfer:queue"
    """Stream key: each row is one entry (XADD), its kept input and chosen output columns as fields."""
    columns: list[str] = Field(default_factory=list)
    """Output columns of each entry besides the kept input columns (default: every model output column)."""
    maxlen: int | None = Field(default=None, ge=1)
    """Trim the stream to about this many entries (XADD MAXLEN ~); None: never."""


class FolderExport(Section):
    kind: Literal["folder"] = "folder"
    path: str = ""
    """Folder or object-store prefix; each committed part's rows are written there under the part's name."""
    format: Literal["parquet", "jsonl", "csv"] = "parquet"
    """File format of the folder's parts."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options when path is an object-store URI."""


class MilvusExport(Section):
    kind: Literal["milvus"] = "milvus"
    uri: str = ""
    """A Milvus server (http://host:19530; its token in the MILVUS_TOKEN variable) or a local file
    (items.db) that Milvus Lite serves inside the job."""
    collection: str = "bulkinfer_results"
    """Collection to upsert into by id (primary key: source.id_column), made when missing."""
    vector: str = ""
    """The vector column (default: the output's one vector column)."""
    columns: list[str] = Field(default_factory=list)
    """Scalar output columns stored beside the vector (default: every other model output column)."""
    index: Literal["AUTOINDEX", "FLAT", "HNSW", "IVF_FLAT"] = "AUTOINDEX"
    """Index type of the vector field when the collection is made."""
    metric: Literal["COSINE", "IP", "L2"] = "COSINE"
    """Distance the index ranks by."""
    batch_rows: int = Field(default=1000, ge=1)
    """Rows per upsert call."""


class LanceDBExport(Section):
    kind: Literal["lancedb"] = "lancedb"
    uri: str = ""
    """The LanceDB database: a folder or an object-store URI (s3://bucket/db)."""
    table: str = "bulkinfer_results"
    """Table to upsert into by id (merge on source.id_column), made when missing."""
    vector: str = ""
    """The vector column (default: the output's one vector column)."""
    columns: list[str] = Field(default_factory=list)
    """Scalar output columns stored beside the vector (default: every other model output column)."""
    index: Literal["none", "IVF_PQ", "IVF_HNSW_SQ", "IVF_FLAT"] = "none"
    """Vector index built when the job completes (none: exact search)."""
    metric: Literal["cosine", "dot", "l2"] = "cosine"
    """Distance the index ranks by."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """Object-store options as LanceDB takes them (aws_endpoint, aws_access_key_id...). Never stored."""


class FeastExport(Section):
    kind: Literal["feast"] = "feast"
    repo: str = ""
    """The Feast repo's folder (its feature_store.yaml), applied (feast apply)."""
    push_source: str = ""
    """The push source the predictions go through into the online store; its feature view's fields are the
    output columns written, keyed by its entity (source.id_column)."""


ExportConfig = Annotated[
    Union[RedisExport, PostgresExport, RedisStreamExport, FolderExport, MilvusExport, LanceDBExport, FeastExport],  # noqa: UP007
    Field(discriminator="kind"),
]
EXPORT_KINDS = (
    RedisExport,
    PostgresExport,
    RedisStreamExport,
    FolderExport,
    MilvusExport,
    LanceDBExport,
    FeastExport,
)


class RouteConfig(Section):
    name: str
    """Route name (letters, digits, _ and -): the report counts its rows under it."""
    when: str
    """Expression over the output columns (comparisons, and/or/not, arithmetic, is null, in); first match wins."""
    export: list[ExportConfig] = Field(min_length=1)
    """Where the route's rows go ([[route.export]] tables, any export kind); not to the output folder."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", v) or v == "default":
            raise ValueError(f"{v!r}: use letters, digits, _ and - ('default' is the rows no route takes)")
        return v

    @field_validator("when")
    @classmethod
    def _when(cls, v: str) -> str:
        from ..core.expr import parse

        try:
            parse(v, "when")  # refused here, with the token and its position
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("when: ")) from None
        return v
