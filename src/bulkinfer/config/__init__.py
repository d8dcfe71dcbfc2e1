"""Job configuration: one frozen pydantic model per concern under :class:`JobConfig`, one
module per section (``source``, ``model``, ``runtime``, ``sink``, ``execution``, ``serve``,
``exports`` and routes, ``operations``: cost, lineage, monitor, index), the whole job in
``job`` and reading it in ``load``.

A job is read from TOML (``bulkinfer run job.toml``); CLI flags and ``--set key=value``
override it. Unknown fields are refused. Each field's docstring is its documentation
and is what ``bulkinfer run --help`` shows.
"""

from __future__ import annotations

from .execution import ExecutionConfig
from .exports import (
    EXPORT_KINDS,
    ExportConfig,
    FeastExport,
    FolderExport,
    LanceDBExport,
    MilvusExport,
    PostgresExport,
    RedisExport,
    RedisStreamExport,
    RouteConfig,
)
from .job import JobConfig
from .load import field_docs, load_config, parse_value
from .model import ModelConfig
from .operations import CostConfig, IndexConfig, LineageConfig, MetricsConfig, MonitorConfig
from .runtime import RuntimeConfig
from .serve import ServeConfig
from .sink import SinkConfig
from .source import SourceConfig

__all__ = [
    "EXPORT_KINDS",
    "CostConfig",
    "ExecutionConfig",
    "ExportConfig",
    "FeastExport",
    "FolderExport",
    "IndexConfig",
    "JobConfig",
    "LanceDBExport",
    "LineageConfig",
    "MetricsConfig",
    "MilvusExport",
    "ModelConfig",
    "MonitorConfig",
    "PostgresExport",
    "RedisExport",
    "RedisStreamExport",
    "RouteConfig",
    "RuntimeConfig",
    "ServeConfig",
    "SinkConfig",
    "SourceConfig",
    "field_docs",
    "load_config",
    "parse_value",
]
