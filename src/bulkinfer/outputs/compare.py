"""``bulkinfer compare OLD/ NEW/``: two finished outputs joined by id, column by column: the
canary check between "new model output written" and "switch the pointer".

Both outputs are hash-partitioned by id into buckets on local disk (a bucket holds about
``bucket_rows`` rows), then joined one bucket at a time, so memory is bounded by a bucket
and never by the outputs. ``--sample N`` keeps the rows whose id hashes below a threshold:
the same ids on both sides, drawn across the whole output.

Per shared output column:

* vectors: the cosine of each row's old and new vector (mean, min, p1, p5, p50: exact up to a
  million rows, then over the million whose ids hash lowest, the same every time), and the
  top-K neighbour overlap: for ``queries`` rows (the lowest id hashes), the share of their K
  nearest neighbours (cosine, among the compared rows) found in both spaces. Dimensions may
  differ (a new model): the overlap is still defined, the cosine is not.
* labels: agreement, the confusion matrix and, per class, rows that left it and joined it.
* numbers: the mean shift, the mean absolute change per row, the KS statistic and the PSI
  of the new distribution against the old one.

Plus rows only in OLD, only in NEW, and the rows that failed in each. ``figures`` flattens
all of it into names (``embedding.cosine.p5``, ``topk_overlap``...) that ``--fail-if`` reads
with the expression language of routes: a gate, never ``eval``.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core.errors import SourceError
from ..core.hashing import id_keys, splitmix64
from ..core.layout import result_columns
from ..core.records import decode_records
from ..core.storage import read_whole
from ..finished.read import Part, finished_output, normalise, part_batches, part_schema
from ..report.columns import column_kind
from .compare_columns import Labels, Numbers, TopK, Vectors, matrix, mean_of, quantiles, unit

__all__ = ["CompareSpec", "compare_outputs", "gate"]

_H = "__bulkinfer_hash"


@dataclass(frozen=True)
class CompareSpec:
    id_column: str | None = None  # None: the id column both runs were given
    columns: tuple[str, ...] = ()  # () : every shared output column
    sample: int | None = None  # about this many ids, drawn by hash across the whole output
    k: int = 10
    queries: int = 200
    bucket_rows: int = 200_000


# -- ids -> 64-bit hashes (the same on both sides, whatever the part layout) ---------------
def id_hashes(ids: pa.Array) -> np.ndarray:
    """A 64-bit hash per id, spread evenly (the buckets and the sample depend on it): integers
    through splitmix64, anything else through BLAKE2b of its text (``core.hashing.id_keys``)."""
    keys = id_keys(ids)
    return splitmix64(keys) if pa.types.is_integer(ids.type) and ids.null_count == 0 else keys


def lowest_ids(parts: list[Part], id_column: str, n: int) -> pa.Array | None:
    """The ``n`` ids of ``parts`` whose hashes are lowest (the same sample every time; None: no rows)."""
    best_hashes, best = np.empty(0, np.uint64), None
    for part in parts:
        for batch in part_batches(part, [id_column], "the job needs an id column"):
            hashes = np.concatenate([best_hashes, id_hashes(batch.column(0))])
            ids = batch.column(0) if best is None else pa.concat_arrays([best, batch.column(0)])
            keep = np.argsort(hashes, kind="stable")[:n]
            best_hashes, best = hashes[keep], ids.take(pa.array(keep))
    return best


# -- partitioning -----------------------------------------------------------------------
def _partition(
    parts: list[Part], columns: list[str], folder: Path, buckets: int, threshold: int | None
) -> tuple[int, list[Path]]:
    """Write ``columns`` (and each row's id hash) of every part into ``buckets`` files; return the rows kept."""
    writers: dict[int, pq.ParquetWriter] = {}
    paths = [folder / f"b{b:05d}.parquet" for b in range(buckets)]
    kept = 0
    try:
        for part in parts:
            for batch in part_batches(part, columns, "compare needs it in both outputs"):
                h = id_hashes(batch.column(0))
                table = pa.Table.from_batches([batch]).append_column(_H, pa.array(h, pa.uint64()))
                if threshold is not None:
                    keep = h < np.uint64(threshold)
                    table, h = table.filter(pa.array(keep)), h[keep]
                kept += table.num_rows
                which = (h % np.uint64(buckets)).astype(np.int64)
                for b in np.unique(which):
                    rows = table.filter(pa.array(which == b))
                    if b not in writers:
                        writers[b] = pq.ParquetWriter(paths[b], rows.schema, compression="lz4")
                    writers[b].write_table(rows)
    finally:
        for w in writers.values():
            w.close()
    return kept, paths


def _read_bucket(path: Path, schema: pa.Schema) -> pa.Table:
    return pq.read_table(path) if path.exists() else schema.empty_table()


# -- the comparison -------------------------------------------------------------------------
def _failed_ids(out: str) -> tuple[int, set[Any]]:
    """Rows failed in a finished output: their count (from _SUCCESS) and the ids the records name."""
    import json

    manifest = json.loads(read_whole(f"{out}/_SUCCESS") or b"{}")
    ids: set[Any] = set()
    for name in manifest.get("error_files", []):
        data = read_whole(f"{out}/{name}")
        for rec in decode_records(data or b""):
            if rec.id is not None:
                ids.add(rec.id)
    return int(manifest.get("rows_failed", 0)), ids


def _passthrough(job: Mapping[str, Any]) -> set[str]:
    cfg = job.get("config", {})
    return {c for c in [cfg.get("source", {}).get("id_column"), *cfg.get("sink", {}).get("keep_columns", [])] if c}


@dataclass
class _Side:
    """One of the two outputs: where it is, its parts, its job and its part schema."""

    where: str
    parts: list[Part]
    job: dict[str, Any]
    schema: pa.Schema | None

    @classmethod
    def read(cls, output: str | Path) -> _Side:
        where = normalise(output)
        parts, job = finished_output(where, "compared")
        return cls(where, parts, job, part_schema(parts))

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def results(self, id_col: str) -> list[str]:
        """The result columns (not the id, nor columns passed through from the input)."""
        names = result_columns(self.schema.names if self.schema else [])
        return [n for n in names if n not in _passthrough(self.job) | {id_col}]

    def empty(self, cols: list[str]) -> pa.Schema | None:
        return pa.schema([*(self.schema.field(c) for c in cols), pa.field(_H, pa.uint64())]) if self.schema else None


def compare_outputs(
    old: str | Path,
    new: str | Path,
    spec: CompareSpec = CompareSpec(),
    on_bucket: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Compare two finished outputs (see the module's docstring); returns every figure."""
    sa, sb = _Side.read(old), _Side.read(new)
    a, b = sa.where, sb.where
    id_col = spec.id_column or sa.job.get("config", {}).get("source", {}).get("id_column")
    if not id_col:
        raise SourceError(f"{a}: the run had no source.id_column; pass --id with the column both outputs share", a)
    names_a, names_b = sa.results(id_col), sb.results(id_col)
    shared = [n for n in names_a if n in names_b and (not spec.columns or n in spec.columns)]
    unknown = [c for c in spec.columns if c not in shared]
    if unknown:
        raise SourceError(f"--column {unknown[0]}: not an output column of both (shared: {', '.join(shared)})", a)
    if sa.schema is not None and sb.schema is not None:
        ta, tb = sa.schema.field(id_col).type, sb.schema.field(id_col).type
        if ta != tb:
            raise SourceError(f"{b}: id column {id_col!r} is {tb} there and {ta} in {a}; compare needs one id type", b)
    biggest = max(sa.rows, sb.rows, 1)
    threshold = int(spec.sample / biggest * 2**64) if spec.sample is not None and spec.sample < biggest else None
    buckets = max(1, math.ceil(min(biggest, spec.sample or biggest) / spec.bucket_rows))
    kinds = {n: column_kind(sa.schema.field(n).type) for n in shared} if sa.schema else {}
    compared = [n for n in shared if kinds[n] in ("vector", "label", "number")]
    pairing = _pair(sa, sb, id_col, {n: kinds[n] for n in compared}, spec, buckets, threshold, on_bucket)
    (failed_a, ids_a), (failed_b, ids_b) = _failed_ids(a), _failed_ids(b)
    result: dict[str, Any] = {
        "old": a,
        "new": b,
        "id_column": id_col,
        "rows_old": sa.rows,
        "rows_new": sb.rows,
        "sample": spec.sample if threshold is not None else None,
        **pairing.counts,
        "failed_old": failed_a,
        "failed_new": failed_b,
        "newly_failed": len(ids_b - ids_a) if ids_b else 0,
        "columns": pairing.figures(),
        "not_compared": {
            **{n: f"{kinds[n]} column: not compared" for n in shared if n not in compared},
            **{n: "only in OLD" for n in names_a if n not in names_b},
            **{n: "only in NEW" for n in names_b if n not in names_a},
        },
    }
    result["figures"] = figures(result)
    return result


@dataclass
class _Paired:
    """What pairing the rows by id gathered: the row counts and each compared column's figures."""

    counts: dict[str, int]
    acc: dict[str, Any]
    overlaps: dict[str, dict[str, Any]]

    def figures(self) -> dict[str, Any]:
        return {
            n: _vector_figures(acc, self.overlaps[n]) if isinstance(acc, Vectors) else acc.figures()
            for n, acc in self.acc.items()
        }


def _pair(
    sa: _Side,
    sb: _Side,
    id_col: str,
    kinds: dict[str, str],
    spec: CompareSpec,
    buckets: int,
    threshold: int | None,
    on_bucket: Callable[[int, int], None] | None,
) -> _Paired:
    """Both outputs partitioned by id hash into ``buckets`` on disk, joined bucket by bucket, each
    compared column (``kinds``: vector, label or number) accumulated; the vectors' neighbour
    overlap in a second pass."""
    a, b, cols = sa.where, sb.where, [id_col, *kinds]
    with tempfile.TemporaryDirectory(prefix="bulkinfer-compare-") as tmp:
        (Path(tmp) / "a").mkdir()
        (Path(tmp) / "b").mkdir()
        kept_a, paths_a = _partition(sa.parts, cols, Path(tmp) / "a", buckets, threshold)
        kept_b, paths_b = _partition(sb.parts, cols, Path(tmp) / "b", buckets, threshold)
        empty_a, empty_b = sa.empty(cols), sb.empty(cols)
        acc: dict[str, Any] = {
            n: {"vector": Vectors, "label": Labels, "number": Numbers}[k]() for n, k in kinds.items()
        }
        joined = only_a = only_b = 0
        for i, (ta, tb, n_only_a, n_only_b) in enumerate(_joined(paths_a, paths_b, empty_a, empty_b, id_col, a, b)):
            only_a, only_b, joined = only_a + n_only_a, only_b + n_only_b, joined + ta.num_rows
            h = ta.column(_H).to_numpy()
            for n, k in kinds.items():
                if k == "vector":
                    acc[n].add(ta.column(n), tb.column(n), h, spec.queries)
                elif k == "number":
                    acc[n].add(ta.column(n), tb.column(n), h)
                else:
                    acc[n].add(ta.column(n), tb.column(n))
            if on_bucket:
                on_bucket(i + 1, 2 * buckets)
        overlaps = {
            n: _overlap(acc[n], paths_a, paths_b, empty_a, empty_b, id_col, n, spec.k, a, b, on_bucket, buckets)
            for n, k in kinds.items()
            if k == "vector"
        }
    counts = {"rows_sampled_old": kept_a, "rows_sampled_new": kept_b, "rows_compared": joined,
              "only_in_old": only_a, "only_in_new": only_b}  # fmt: skip
    return _Paired(counts, acc, overlaps)


def _vector_figures(v: Vectors, overlap: dict[str, Any]) -> dict[str, Any]:
    """A vector column's figures: the row-wise cosine's quantiles (when the dimensions agree) and
    the neighbour overlap."""
    fig: dict[str, Any] = {"kind": "vector", "dims": list(v.dims) if v.dims else None, "invalid": v.invalid}
    if v.cos is not None:
        q = quantiles(v.sample.column()) or {}
        fig["cosine"] = {"mean": mean_of(v.cos), "min": v.cos["min"], "p1": q.get("p1"), "p5": q.get("p5"),
                         "p50": q.get("p50")}  # fmt: skip
    else:
        fig["cosine"] = None
        if v.dims and v.dims[0] != v.dims[1]:
            fig["cosine_note"] = f"dimensions differ ({v.dims[0]} vs {v.dims[1]}): no row-wise cosine"
    return {**fig, **overlap}


def _joined(
    paths_a: list[Path], paths_b: list[Path], sa: Any, sb: Any, id_col: str, a: str, b: str
) -> Iterator[tuple[pa.Table, pa.Table, int, int]]:
    """Each bucket's rows present on both sides, in matching order, and how many rows only
    one side has (ids are unique on each side, so the counts are exact)."""
    for pa_, pb_ in zip(paths_a, paths_b, strict=True):
        ta, tb = _read_bucket(pa_, sa), _read_bucket(pb_, sb)
        for t, where in ((ta, a), (tb, b)):
            if pc.count_distinct(t.column(id_col)).as_py() != t.num_rows:
                raise SourceError(f"{where}: ids in {id_col!r} repeat; compare needs one row per id", where)
        left = pa.table({"k": ta.column(id_col), "i": pa.array(np.arange(ta.num_rows))})
        right = pa.table({"k": tb.column(id_col), "j": pa.array(np.arange(tb.num_rows))})
        pairs = left.join(right, "k", join_type="inner").sort_by("i")
        n = pairs.num_rows
        yield ta.take(pairs.column("i")), tb.take(pairs.column("j")), ta.num_rows - n, tb.num_rows - n


def _overlap(
    v: Vectors,
    paths_a: list[Path],
    paths_b: list[Path],
    sa: Any,
    sb: Any,
    id_col: str,
    column: str,
    k: int,
    a: str,
    b: str,
    on_bucket: Callable[[int, int], None] | None,
    buckets: int,
) -> dict[str, Any]:
    """Top-K neighbour overlap of the queries, in OLD's space and in NEW's, over every compared row."""
    if not v.queries:
        return {"topk_overlap": None, "k": k, "queries": 0}
    q_ids = np.asarray([q[0] for q in v.queries], np.uint64)
    old_k = TopK(np.stack([q[1] for q in v.queries]), q_ids, k)
    new_k = TopK(np.stack([q[2] for q in v.queries]), q_ids, k)
    for i, (ta, tb, _, _) in enumerate(_joined(paths_a, paths_b, sa, sb, id_col, a, b)):
        mo, vo = matrix(ta.column(column))
        mn, vn = matrix(tb.column(column))
        both = vo & vn
        h = ta.column(_H).to_numpy()[both]
        old_k.add(unit(mo[both]), h)
        new_k.add(unit(mn[both]), h)
        if on_bucket:
            on_bucket(buckets + i + 1, 2 * buckets)
    per_query = [
        len(x & y) / max(len(x), 1) for x, y in zip(old_k.neighbour_sets(), new_k.neighbour_sets(), strict=True)
    ]
    return {"topk_overlap": float(np.mean(per_query)), "k": k, "queries": len(per_query)}


def figures(result: Mapping[str, Any]) -> dict[str, float | None]:
    """Every figure under one flat name (``embedding.cosine.p5``); a figure of the only column of
    its kind also goes by its short name (``cosine.p5``, ``topk_overlap``, ``agreement``, ``ks``)."""
    out: dict[str, float | None] = {
        k: result[k]
        for k in ("rows_compared", "only_in_old", "only_in_new", "failed_old", "failed_new", "newly_failed")
    }
    by_kind: dict[str, list[str]] = {}
    for name, col in result["columns"].items():
        by_kind.setdefault(col["kind"], []).append(name)
        flat: dict[str, float | None] = {}
        if col["kind"] == "vector":
            for q, v in (col["cosine"] or dict.fromkeys(("mean", "min", "p1", "p5", "p50"))).items():
                flat[f"cosine.{q}"] = v
            flat["topk_overlap"] = col["topk_overlap"]
        elif col["kind"] == "label":
            flat["agreement"] = col["agreement"]
        else:
            for key in ("mean_shift", "mean_abs_diff", "ks", "psi"):
                flat[key] = col[key]
        for key, value in flat.items():
            out[f"{name}.{key}"] = value
        col["_flat"] = flat
    for names in by_kind.values():
        if len(names) == 1:
            out.update(result["columns"][names[0]].pop("_flat"))
    for col in result["columns"].values():
        col.pop("_flat", None)
    return out


def gate(condition: str, figs: Mapping[str, float | None]) -> tuple[bool, dict[str, float | None]]:
    """Whether ``condition`` holds for the figures (then the gate fails), and the figures it read.
    A figure it reads that could not be computed fails the gate: a canary that measured nothing
    must not pass."""
    from ..core.expr import ExprError, columns, mask, parse

    node = parse(condition, "--fail-if")
    used = sorted(columns(node))
    unknown = [n for n in used if n not in figs]
    if unknown:
        raise ExprError(f"--fail-if: no figure {unknown[0]!r}; the figures are: {', '.join(sorted(figs))}")
    read = {n: figs[n] for n in used}
    missing = [n for n, v in read.items() if v is None or (isinstance(v, float) and math.isnan(v))]
    if missing:
        return True, read
    table = pa.table({n: pa.array([float(v)], pa.float64()) for n, v in read.items()})  # type: ignore[arg-type]
    return bool(mask(node, table, "--fail-if")[0].as_py()), read


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """The comparison for a person: one line per figure group."""
    lines = [
        f"{result['old']} -> {result['new']} (by {result['id_column']})",
        f"rows: {result['rows_compared']} compared"
        + (f" (a sample of about {result['sample']})" if result["sample"] else "")
        + f", {result['only_in_old']} only in OLD, {result['only_in_new']} only in NEW; "
        f"failed: {result['failed_old']} in OLD, {result['failed_new']} in NEW ({result['newly_failed']} newly)",
    ]
    for name, col in result["columns"].items():
        if col["kind"] == "vector":
            cos = col["cosine"]
            cos_text = (
                col.get("cosine_note", "no row to compare")
                if cos is None
                else " ".join(f"{k} {_fmt(cos[k])}" for k in ("mean", "p50", "p5", "p1", "min"))
            )
            lines.append(
                f"{name} (vector {col['dims']}): cosine {cos_text}; "
                f"top-{col['k']} overlap {_fmt(col['topk_overlap'])} over {col['queries']} queries"
            )
        elif col["kind"] == "label":
            flips = ", ".join(
                f"{c} -{f['left']}/+{f['joined']}" for c, f in col.get("flips", {}).items() if f["left"] or f["joined"]
            )
            lines.append(f"{name} (label): agreement {_fmt(col['agreement'])}" + (f"; flips {flips}" if flips else ""))
        else:
            lines.append(
                f"{name} (number): mean {_fmt(col.get('mean_old'))} -> {_fmt(col.get('mean_new'))} "
                f"(shift {_fmt(col['mean_shift'])}), mean |change| {_fmt(col['mean_abs_diff'])}, "
                f"KS {_fmt(col['ks'])}, PSI {_fmt(col['psi'])}"
            )
    for name, why in result["not_compared"].items():
        lines.append(f"{name}: {why}")
    return lines
