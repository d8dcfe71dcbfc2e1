"""Inputs: list and fingerprint files (``listing``), cut them into shards and read them back
(``shards``), one module per format (``parquet``, ``csv``, ``jsonl``) behind one registry
(``registry``), and one type per column across files (``types``)."""

from __future__ import annotations

from .base import ROW, BadRow, Format, InputFile, Shard, Span
from .listing import list_inputs
from .registry import EXTENSIONS, FORMATS, detect_format
from .shards import plan_shards, read_shard
from .shardtable import ShardTable
from .types import check_columns, head_schema, settle_types

__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "ROW",
    "BadRow",
    "Format",
    "InputFile",
    "Shard",
    "ShardTable",
    "Span",
    "check_columns",
    "detect_format",
    "head_schema",
    "list_inputs",
    "plan_shards",
    "read_shard",
    "settle_types",
]
