"""The best K rows of a whole job (``sink.top_k``).

Each shard's part keeps only its own best K (:meth:`Best.rows`, as it is staged), so a resumed
job never reads a committed shard again; the finish step (:func:`keep_best`) then reads the
parts' ranked column and ids only, keeps a running best K over them, and rewrites each part to
hold just its rows of the job's best K, each with its rank in ``top_k_rank`` (1 = best).

Ranking: ``by`` in ``order``; ties go to the lower id (``source.id_column``), then to the
earlier part and row; a null or NaN score ranks after every number, in either order. A finish
killed half-way is simply run again: a part it already cut still holds every one of its rows
of the best K, so the same K win, and the parts already cut are left as they are.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.errors import ConfigError
from ..core.faults import crash_point
from ..sinks.files import deserialize, serialize
from ..sinks.lifecycle import Part

if TYPE_CHECKING:
    from ..config.sink import TopKConfig
    from .ledger import OutputLedger

__all__ = ["RANK", "Best", "keep_best"]

RANK = "top_k_rank"
MERGE_ROWS = 1_000_000
"""Candidates gathered before the running best K is cut back to K (a cut per part would sort
K rows once a part: 100,000 × 1,000 parts)."""


@dataclass(frozen=True)
class Best:
    """``sink.top_k`` as the parts apply it: the column, K, the order and the id column."""

    by: str
    k: int
    descending: bool
    id_column: str

    @classmethod
    def of(cls, spec: TopKConfig | None, id_column: str | None) -> Best | None:
        return None if spec is None or not id_column else cls(spec.by, spec.k, spec.order == "desc", id_column)

    def ranking(self, table: pa.Table, where: str) -> pa.Table:
        """``table``'s ranking columns: ``n`` (no score: null or NaN), ``s`` (the score, float64), ``i`` (the id)."""
        missing = [c for c in (self.by, self.id_column) if c not in table.column_names]
        if missing:
            setting = "sink.top_k.by" if self.by in missing else "source.id_column"
            raise ConfigError(f"{setting}: {where} has no column {missing[0]!r}; its columns: {table.column_names}")
        score = table[self.by]
        if not (pa.types.is_integer(score.type) or pa.types.is_floating(score.type) or pa.types.is_null(score.type)):
            raise ConfigError(f"sink.top_k.by: {self.by!r} holds {score.type}, not numbers; rank a numeric column")
        score = pc.cast(score, pa.float64())
        unranked = pc.or_kleene(pc.is_null(score), pc.is_nan(score)).fill_null(True)
        return pa.table({"n": unranked, "s": pc.if_else(unranked, 0.0, score), "i": table[self.id_column]})

    def order(self, ranked: pa.Table) -> np.ndarray:
        """Row positions of ``ranked`` (columns ``n``: no score, ``s``, ``i``, then any tie-breakers), best first."""
        keys = [("n", "ascending"), ("s", "descending" if self.descending else "ascending")]
        keys += [(c, "ascending") for c in ranked.column_names if c not in ("n", "s")]
        return np.asarray(pc.sort_indices(ranked, sort_keys=keys))

    def rows(self, table: pa.Table, where: str) -> pa.Table:
        """``table``'s best K rows, in the order they came (all of them when there are K or fewer)."""
        ranked = self.ranking(table, where)
        if table.num_rows <= self.k:
            return table
        positions = np.arange(table.num_rows, dtype=np.int64)
        winners = self.order(ranked.append_column("r", pa.array(positions)))[: self.k]
        return table.take(np.sort(winners))


def _table(data: bytes, fmt: str, columns: list[str] | None = None) -> pa.Table:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(data), columns=columns)
    table = deserialize(data, fmt)
    return table.select(columns) if columns else table


def winners(best: Best, ledger: OutputLedger, parts: list[str], fmt: str) -> pa.Table:
    """The job's best K over ``parts`` (columns ``p``: the part's place in ``parts``, ``r``: the
    row in it), best first."""
    running: list[pa.Table] = []
    held = 0
    for n, name in enumerate(parts):
        ranked = best.ranking(_table(ledger.read_part(name), fmt, [best.by, best.id_column]), name)
        rows = ranked.num_rows
        running.append(ranked.append_column("p", pa.array(np.full(rows, n, np.int32))).append_column(
            "r", pa.array(np.arange(rows, dtype=np.int64))))  # fmt: skip
        held += rows
        if held >= max(MERGE_ROWS, 4 * best.k) or n == len(parts) - 1:
            together = pa.concat_tables(running, promote_options="permissive")
            running = [together.take(best.order(together)[: best.k])]
            held = running[0].num_rows
    return running[0].select(["p", "r"]) if running else pa.table({"p": pa.array([], pa.int32()), "r": []})


def _cut(table: pa.Table, rows: np.ndarray, ranks: np.ndarray) -> pa.Table:
    """The part's rows ``rows`` (in their order), each with its rank."""
    if RANK in table.column_names:
        table = table.drop_columns([RANK])
    order = np.argsort(rows, kind="stable")
    return table.take(rows[order]).append_column(RANK, pa.array(ranks[order], pa.int64()))


def keep_best(
    best: Best, ledger: OutputLedger, parts: list[str], fmt: str, compression: str
) -> tuple[dict[str, Part], dict[str, Any]]:
    """Rewrite each of ``parts`` to hold only its rows of the job's best K; return the parts'
    new figures (for ``_SUCCESS``) and the ranking's settings."""
    won = winners(best, ledger, parts, fmt)
    part_of, row_of = won["p"].to_numpy(), won["r"].to_numpy()
    rank = np.arange(1, won.num_rows + 1, dtype=np.int64)
    restated: dict[str, Part] = {}
    for n, name in enumerate(parts):
        mine = part_of == n
        data = ledger.read_part(name)
        table = _table(data, fmt)
        if RANK not in table.column_names or table.num_rows != mine.sum():  # not cut by an earlier finish
            data = serialize(_cut(table, row_of[mine], rank[mine]), fmt, compression)
            ledger.write_file(name, data)
            crash_point("top-k-part-cut")
        restated[name] = _figures(name, data, int(mine.sum()))
    return restated, {"by": best.by, "k": best.k, "order": "desc" if best.descending else "asc"}


def _figures(name: str, data: bytes, rows: int) -> Part:
    return Part(name=name, rows=rows, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
