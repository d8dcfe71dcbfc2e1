"""Inputs: list and fingerprint files (``listing``, ``expand``), cut them into shards and read
them back (``shards``; what a shard is and the protocol every format implements: ``shard``),
one module per format (``parquet``, ``csv``, ``jsonl``, ``openai_batch``, pictures: ``images``,
``webdataset``, ``video``) behind one registry (``registry``), table snapshots (``tables``), and
one type per column across files (``types``)."""

from __future__ import annotations

from .listing import list_inputs
from .parquet import reading_in_order
from .registry import EXTENSIONS, FORMATS, detect_format
from .shard import ROW, BadRow, Format, InputFile, Shard, Span
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
    "reading_in_order",
    "settle_types",
]
