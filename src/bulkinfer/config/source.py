"""``[source]``: where the rows come from."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from .base import Section


class SourceConfig(Section):
    paths: list[str] = Field(default_factory=list)
    """Input files: paths, directories, globs or fsspec URIs (file://, memory://, s3://...)."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options for the inputs' object store (s3: endpoint_url, key, secret, profile, client_kwargs...);
    empty: the store's usual configuration (AWS_* variables, a profile, an instance role). Never stored."""
    format: Literal["auto", "parquet", "csv", "jsonl", "delta", "iceberg", "openai-batch"] = "auto"
    """Input format; 'auto' picks it from each file's extension (a .jsonl file of OpenAI batch requests:
    openai-batch). delta: paths are Delta Lake tables; iceberg: paths are Iceberg table names in source.catalog."""
    id_column: str | None = None
    """Column that identifies a row; copied to the output and to error records. Optional."""
    shard_rows: int = Field(default=10_000, ge=1)
    """Target rows per shard, the unit of commit and resume (Parquet shards follow row groups)."""
    max_record_bytes: int = Field(default=64 << 20, ge=1)
    """A record longer than this (a JSONL, batch-file or CSV record; a columnar row's text and binary
    values in the columns read) is an error row naming its size; line formats never read it."""
    read_batch_rows: int = Field(default=4096, ge=1)
    """Rows per Arrow record batch read from the input."""
    column_types: dict[str, str] = Field(default_factory=dict)
    """Arrow types of input columns ({id = "string", price = "double"}); the others are the
    types the files start with, unified across files (int and double: double; else string)."""
    version: int | None = Field(default=None, ge=0)
    """Delta: the table version to read (default: the latest)."""
    snapshot_id: int | None = None
    """Iceberg: the snapshot to read (default: the current one)."""
    as_of: str | None = None
    """Delta or Iceberg: read the table as it was at this ISO 8601 time (2026-12-02T23:00:00Z)."""
    catalog: dict[str, Any] = Field(default_factory=dict)
    """Iceberg: the catalog's name and properties, as pyiceberg's load_catalog takes them
    ({name = "prod", type = "sql", uri = "sqlite:///cat.db", warehouse = "file:///wh"})."""
    previous: str | None = None
    """An earlier output of this job, written with input hashes (--incremental-from): rows whose id and
    input are unchanged take their results from it instead of being inferred."""

    @field_validator("column_types")
    @classmethod
    def _known_types(cls, value: dict[str, str]) -> dict[str, str]:
        from ..core.schema import parse_type

        for name, type_name in value.items():
            try:
                parse_type(type_name)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return value
