"""The previous output of an incremental run (``--incremental-from PREVIOUS_OUT/``): whether
it can serve this job at all (a finished Parquet output with ids and input hashes) and whether
its results can stand for this job's (the same model and every setting that changes results).
Read by the settle step before any work, and by the runner that reuses its rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.errors import ConfigError, SourceError
from ..core.layout import HASH_COLUMN
from .read import finished_output, part_schema

__all__ = ["check_previous", "check_reusable", "previous_hint", "require_id", "schema_names"]


def schema_names(parts: list[Any]) -> list[str]:
    schema = part_schema(parts)
    return list(schema.names) if schema is not None else []


def check_previous(where: str, id_column: str | None, sink_format: str) -> dict[str, Any]:
    """The previous output's job.json, after checking it can serve an incremental run."""
    require_id(id_column)
    if sink_format != "parquet":
        raise ConfigError("--incremental-from writes Parquet (results are read back by id): drop sink.format")
    try:
        parts, job = finished_output(where, "reused (--incremental-from)")
    except SourceError as exc:
        raise ConfigError(f"--incremental-from: {exc}") from None
    names = schema_names(parts)
    if parts and HASH_COLUMN not in names:
        raise ConfigError(f"--incremental-from: {previous_hint(where)}")
    if parts and id_column not in names:
        raise ConfigError(f"--incremental-from: {where} has no id column {id_column!r} (it has {', '.join(names)})")
    return job


def check_reusable(previous_job: Mapping[str, Any], identity: Mapping[str, Any], digest: str) -> str | None:
    """Why the previous output's results cannot stand for this job's (None: they can)."""
    if previous_job.get("model_digest") != digest:
        return "the model changed (another digest)"
    theirs = previous_job.get("identity", {})
    ignore = {  # settings of the output's layout and destinations: they do not change a row's results
        "source.format",
        "source.shard_rows",
        "source.column_types",
        "source.id_column",
        "source.previous",
        "sink.format",
        "sink.keep_columns",
        "sink.preserve_order",
        "sink.compression",
        "sink.input_hash",
        "sink.mode",
        "execution.limit_rows",
        "export",
        "route",
    }
    for key, value in identity.items():
        if key in ignore:
            continue
        if theirs.get(key) != value:
            return f"{key} changed ({theirs.get(key)!r} -> {value!r})"
    return None


def require_id(id_column: str | None) -> str:
    if not id_column:
        raise ConfigError("--incremental-from needs source.id_column: rows are matched to the previous output by id")
    return id_column


def previous_hint(where: str) -> str:
    return (
        f"the previous output {where} was written without input hashes (sink.input_hash = false, or by an older "
        "bulkinfer, which wrote none by default): run it once with input hashes, then use it with --incremental-from"
    )
