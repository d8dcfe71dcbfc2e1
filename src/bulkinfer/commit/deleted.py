"""An incremental run's deleted ids: the previous output's ids that are no longer in the input,
listed in ``_deleted.parquet`` by the finish step."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..core.hashing import id_keys
from ..core.layout import DELETED
from ..finished.previous import previous_hint
from ..finished.read import finished_output, part_batches

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..plan import JobPlan
    from .ledger import OutputLedger

__all__ = ["deleted_rows", "write_deleted"]


def deleted_rows(where: str, id_column: str, current: np.ndarray) -> pa.Table:
    """The previous output's ids that ``current`` (id keys) no longer has."""
    parts, _ = finished_output(where, "reused (--incremental-from)")
    now = np.sort(current)
    gone: list[pa.Array] = []
    for part in parts:
        for batch in part_batches(part, [id_column], previous_hint(where)):
            keys = id_keys(batch.column(0))
            at = np.minimum(np.searchsorted(now, keys), max(len(now) - 1, 0))
            present = now[at] == keys if len(now) else np.zeros(len(keys), bool)
            gone.append(batch.column(0).filter(pa.array(~present)))
    ids = pa.concat_arrays(gone) if gone else pa.array([], pa.int64())
    return pa.table({id_column: ids})


def write_deleted(
    previous: str, cfg: JobConfig, plan: JobPlan, ledger: OutputLedger, report: dict[str, Any]
) -> dict[str, Any]:
    """An incremental run lists the previous output's ids that are no longer in the input in
    ``_deleted.parquet``: a record beside the parts rather than tombstone rows, so the snapshot
    stays readable on its own and a ``sink.mode = "delta"`` consumer reads the deletions from one
    file. Rows that failed this run are not deleted: they are still in the input."""
    import pyarrow.parquet as pq

    from ..core.schema import parse_type
    from ..sources import read_shard

    id_col = cfg.source.id_column or ""
    types = {c: parse_type(t) for c, t in (plan.column_types or {}).items() if c == id_col}
    keys = [
        id_keys(batch.column(id_col))
        for shard in plan.shards
        for batch in read_shard(shard, [id_col], cfg.source.read_batch_rows, lambda row, msg: None, types)
    ]
    gone = deleted_rows(previous, id_col, np.concatenate(keys) if keys else np.empty(0, np.uint64))
    buf = io.BytesIO()
    pq.write_table(gone, buf)
    ledger.write_file(DELETED, buf.getvalue())
    report["reuse"]["rows_deleted"] = gone.num_rows
    return {"deleted": {"file": DELETED, "rows": gone.num_rows}}
