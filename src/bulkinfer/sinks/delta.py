"""Transactional table output (``sink.format = "delta"``): the output folder is a Delta Lake
table, and each shard's part joins it in a Delta commit of its own.

A part is staged and renamed into place as a Parquet file of the folder (the file sink's
steps), then added to the table's log in one transaction carrying Delta's idempotent
application id ``bulkinfer/<unit>`` (the shard, or the shard's tail: an output folder holds
one job, the ledger sees to that), and only then
does the ledger line make it count. When a run dies between the Delta commit and the
ledger line, the rerun redoes the shard, finds its application id already in the table's
log and keeps the file that commit added instead of adding the rows a second time: every
row is in the table's latest version exactly once. A file renamed but never committed to
the log is invisible to every Delta reader (deltalake, DuckDB, Spark, Polars), and the
rerun's file replaces it. The ledger (``_bulkinfer/``), ``_errors/`` and ``_SUCCESS`` sit
beside ``_delta_log/``; Delta ignores ``_``-names.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ..core.errors import OutputError
from ..core.faults import crash_point
from .files import FileSink
from .lifecycle import Part, Published, StagedOutput

__all__ = ["DeltaSink", "table_files"]


def table_files(out_dir: Path) -> set[str]:
    """The data files the Delta table in ``out_dir`` holds now (none when there is no table yet)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return {uri.rstrip("/").rsplit("/", 1)[-1] for uri in DeltaTable(str(out_dir)).file_uris()}
    except TableNotFoundError:
        return set()


class DeltaSink(FileSink):
    """Parquet parts committed to a Delta table in ``out_dir``, one idempotent commit per part."""

    def __init__(self, out_dir: Path, compression: str = "zstd", redact: bool = False) -> None:
        super().__init__(out_dir, "delta", compression, redact)

    def withdraw(self, staged: StagedOutput, published: Published) -> None:
        """Only the error file: the part is in the Delta log already (a Delta reader's commit), and
        the resume keeps the parts the table holds."""
        if published.error_file is not None:
            (self.errors_dir / published.error_file).unlink(missing_ok=True)

    def publish_many(self, staged: Sequence[StagedOutput]) -> list[Published]:
        """One Delta commit per part, as :meth:`publish` makes them (each is idempotent)."""
        return [self.publish(s) for s in staged]

    def publish(self, staged: StagedOutput) -> Published:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.exceptions import TableNotFoundError

        if staged.part is None:
            return super().publish(staged)
        app = f"bulkinfer/{staged.unit}"
        try:
            table: DeltaTable | None = DeltaTable(str(self.out_dir))
        except TableNotFoundError:
            table = None
        done = table.transaction_version(app) if table is not None else None
        if done is not None:  # an earlier attempt committed this part to the table: keep its file
            (self.out_dir / staged.part.temp).unlink(missing_ok=True)  # only the part: its error file publishes
            errors_only = StagedOutput(staged.shard, None, staged.errors, staged.failed, None)
            return Published(self._committed_part(staged.part.part.name), super().publish(errors_only).error_file)
        published = super().publish(staged)
        assert published.part is not None
        props = CommitProperties(app_transactions=[Transaction(app, 1, int(time.time() * 1000))])
        try:
            self._commit(table, published.part, props)
        except Exception as exc:  # deltalake's errors: the log could not be written
            what = f"{type(exc).__name__}: {exc}"
            raise OutputError(
                f"{self.out_dir}: cannot commit {published.part.name} to the Delta table ({what}); rerun to resume"
            ) from exc
        crash_point("delta-committed")
        return published

    def _commit(self, table: Any, part: Part, props: Any) -> None:
        from deltalake import Schema
        from deltalake.transaction import AddAction, create_table_with_add_actions

        path = self.out_dir / part.name
        meta = pq.read_metadata(path)
        stats = json.dumps({"numRecords": meta.num_rows})
        stat = path.stat()
        add = AddAction(part.name, stat.st_size, {}, int(stat.st_mtime * 1000), True, stats)
        schema = meta.schema.to_arrow_schema()
        if table is None:
            create_table_with_add_actions(
                str(self.out_dir), Schema.from_arrow(schema), [add], mode="append", commit_properties=props
            )
        else:
            table.create_write_transaction([add], "append", schema, commit_properties=props)

    def _committed_part(self, name: str) -> Part:
        data = (self.out_dir / name).read_bytes()
        rows = pq.read_metadata(self.out_dir / name).num_rows
        return Part(name=name, rows=rows, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
