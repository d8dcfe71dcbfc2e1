"""Versioned inputs: a Delta Lake table (``deltalake``, the Rust implementation: no JVM) or
an Iceberg table (``pyiceberg``) read at one snapshot, as the Parquet data files that make
that snapshot up.

``source.version`` (Delta) / ``source.snapshot_id`` (Iceberg) / ``source.as_of`` (both: an
ISO 8601 time) pick the snapshot; by default the latest. The data files of a snapshot never
change, so the job's fingerprint (which lists them) pins the snapshot: a resume never mixes
two. Shards follow the data files and their row groups like any Parquet input. Files are
fingerprinted from the table's metadata (path, size, version), not by reading them.

Refused with one line, rather than read wrong: Delta tables with deletion vectors and
Iceberg snapshots with delete files (rows deleted without rewriting their file would come
back), and columns the job needs that are Delta partition columns (their values live in
the log, not in the files).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ..core.errors import ConfigError, SourceError
from .shard import InputFile

if TYPE_CHECKING:
    from ..config import SourceConfig

__all__ = ["TABLE_FORMATS", "table_inputs"]

TABLE_FORMATS = ("delta", "iceberg")


def _file(uri: str, size: int, version: str) -> InputFile:
    digest = hashlib.sha256(f"{uri}\0{size}\0{version}".encode()).hexdigest()[:32]
    return InputFile(uri=uri, format="parquet", size=size, version=version, digest=digest)


def _when(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"source.as_of: {text!r} is not an ISO 8601 time (2026-12-02T23:00:00Z)") from None
    if when.tzinfo is None:
        raise ConfigError(f"source.as_of: {text!r} has no time zone; add Z or +01:00")
    return when


def _delta(path: str, src: SourceConfig, columns: Sequence[str]) -> list[InputFile]:
    try:
        from deltalake import DeltaTable
    except ImportError as exc:
        raise ConfigError("source.format = 'delta' needs deltalake: pip install 'bulkinfer[delta]'") from exc
    from deltalake.exceptions import TableNotFoundError

    try:
        dt = DeltaTable(path, version=src.version) if src.version is not None else DeltaTable(path)
        if src.as_of is not None:
            dt.load_as_version(_when(src.as_of))
    except TableNotFoundError:
        raise SourceError(f"{path}: not a Delta table (no _delta_log); check source.paths", path) from None
    except Exception as exc:  # deltalake raises its own errors for a version or time it does not hold
        raise SourceError(f"{path}: {' '.join(str(exc).split())[:200]}", path) from exc
    features = dt.protocol().reader_features or []
    if "deletionVectors" in features:
        raise SourceError(
            f"{path}: the Delta table uses deletion vectors, which bulkinfer does not apply; "
            "rewrite the files (OPTIMIZE ... or REORG TABLE ... APPLY (PURGE)) or read a copy without them",
            path,
        )
    parts = set(dt.metadata().partition_columns) & set(columns)
    if parts:
        raise SourceError(
            f"{path}: {sorted(parts)[0]!r} is a partition column of the Delta table; its values are in the "
            "table's log, not in the data files bulkinfer reads",
            path,
        )
    version = f"delta:{dt.version()}"
    import pyarrow as pa

    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()  # an arro3 table: Arrow's C interface
    from urllib.parse import unquote

    sizes = {unquote(p): int(b or 0) for p, b in zip(actions["path"], actions["size_bytes"], strict=True)}
    root = unquote(dt.table_uri.removeprefix("file://")).rstrip("/") + "/"
    files = []
    for uri in dt.file_uris():
        rel = unquote(uri)
        rel = rel[len(root) :] if rel.startswith(root) else rel
        size = sizes.get(rel)
        if size is None:  # a path spelt differently in the log: ask the filesystem
            from ..core.storage import filesystem

            fs, fpath = filesystem(uri)
            size = int(fs.info(fpath).get("size") or 0)
        files.append(_file(uri, size, version))
    return files


def _iceberg(name: str, src: SourceConfig) -> list[InputFile]:
    try:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError
    except ImportError as exc:
        raise ConfigError("source.format = 'iceberg' needs pyiceberg: pip install 'bulkinfer[iceberg]'") from exc
    props = dict(src.catalog)
    catalog_name = str(props.pop("name", "default"))
    try:
        table = load_catalog(catalog_name, **props).load_table(name)
    except NoSuchTableError:
        raise SourceError(f"{name}: no such Iceberg table in catalog {catalog_name!r}", name) from None
    except Exception as exc:
        raise SourceError(f"{name}: cannot load the Iceberg table ({' '.join(str(exc).split())[:200]})", name) from exc
    if src.snapshot_id is not None:
        snapshot = table.snapshot_by_id(src.snapshot_id)
    elif src.as_of is not None:
        snapshot = table.snapshot_as_of_timestamp(int(_when(src.as_of).timestamp() * 1000))
    else:
        snapshot = table.current_snapshot()
    if snapshot is None:
        if src.snapshot_id is not None or src.as_of is not None:
            raise SourceError(f"{name}: no snapshot {src.snapshot_id or 'as of ' + str(src.as_of)}", name)
        return []
    files = []
    for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
        if task.delete_files:
            raise SourceError(
                f"{name}: snapshot {snapshot.snapshot_id} has delete files, which bulkinfer does not apply; "
                "rewrite the data files (rewrite_data_files) or read an earlier snapshot",
                name,
            )
        f = task.file
        files.append(_file(f.file_path, int(f.file_size_in_bytes), f"iceberg:{snapshot.snapshot_id}"))
    return files


def table_inputs(paths: Sequence[str], src: SourceConfig, columns: Sequence[str] = ()) -> list[InputFile]:
    """The Parquet data files of each table in ``paths`` at the chosen snapshot."""
    out: list[InputFile] = []
    for path in paths:
        out.extend(_delta(path, src, columns) if src.format == "delta" else _iceberg(path, src))
    return sorted(out, key=lambda f: f.uri)
