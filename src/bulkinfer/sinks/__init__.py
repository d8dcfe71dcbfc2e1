"""Where results go: the sink lifecycle (``lifecycle``), the file sink (``files``: a local or
shared folder, Parquet/JSONL/CSV parts renamed into place), the object-store and Delta sinks,
and the export targets (``exports``: the contract; one module per target). Both factories,
:func:`make_sink` and :func:`make_target`, live here: a new sink or target is one module and
one branch below."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..core.layout import ERRORS
from ..core.storage import is_remote
from .exports import ExportTarget
from .files import EXTENSIONS, FileSink, part_name, serialize, write_bytes, write_part
from .lifecycle import Part, Published, Sink, Staged, StagedOutput

if TYPE_CHECKING:
    from ..config import ExportConfig, JobConfig

__all__ = [
    "ERRORS",
    "EXTENSIONS",
    "ExportTarget",
    "FileSink",
    "Part",
    "Published",
    "Sink",
    "Staged",
    "StagedOutput",
    "is_remote",
    "make_exports",
    "make_route_targets",
    "make_sink",
    "make_target",
    "part_name",
    "serialize",
    "write_bytes",
    "write_part",
]


def make_sink(cfg: JobConfig) -> Sink:
    """The sink ``cfg.sink`` describes: a folder, or an object-store prefix (any fsspec URI)."""
    sk, redact = cfg.sink, cfg.execution.redact
    if sk.format == "delta":
        if is_remote(sk.path):
            raise ConfigError("sink.format: delta writes a table in a local or shared folder, not an object store")
        from .delta import DeltaSink

        return DeltaSink(Path(sk.path.removeprefix("file://")).expanduser(), sk.compression, redact)
    if is_remote(sk.path) and sk.format == "zarr":
        raise ConfigError("sink.format: zarr writes its array in a local or shared folder, not an object store")
    if is_remote(sk.path):
        from .objects import ObjectSink

        return ObjectSink(sk.path, sk.format, sk.compression, sk.storage_options, redact)
    return FileSink(Path(sk.path.removeprefix("file://")).expanduser(), sk.format, sk.compression, redact)


def make_exports(cfg: JobConfig) -> list[ExportTarget]:
    """The ``[[export]]`` targets (they get the rows of the default route), and a grid job's array
    output (``sink.format = "zarr"``: written as an export is, before each shard's commit)."""
    targets = [make_target(spec, f"export[{i}]", cfg.execution.redact) for i, spec in enumerate(cfg.export)]
    if cfg.sink.format == "zarr":
        from .zarr import ZarrRegions

        targets.append(ZarrRegions(cfg))
    return targets


def make_route_targets(cfg: JobConfig) -> dict[str, list[ExportTarget]]:
    """Each route's targets, by route name."""
    redact = cfg.execution.redact
    return {
        r.name: [make_target(s, f"route[{r.name}].export[{i}]", redact) for i, s in enumerate(r.export)]
        for r in cfg.route
    }


def make_target(spec: ExportConfig, where: str, redact: bool = False) -> ExportTarget:
    if spec.kind == "redis":
        from .redis import RedisTarget

        return RedisTarget(spec, where)
    if spec.kind == "postgres":
        from .postgres import PostgresTarget

        return PostgresTarget(spec, where, redact)
    if spec.kind == "redis_stream":
        from .streams import RedisStreamTarget

        return RedisStreamTarget(spec, where)
    if spec.kind == "milvus":
        from .milvus import MilvusTarget

        return MilvusTarget(spec, where)
    if spec.kind == "lancedb":
        from .lancedb import LanceDBTarget

        return LanceDBTarget(spec, where)
    if spec.kind == "feast":
        from .feast import FeastTarget

        return FeastTarget(spec, where)
    from .folder import FolderTarget

    return FolderTarget(spec, where)
