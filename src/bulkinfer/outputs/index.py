"""``bulkinfer index``: an approximate-nearest-neighbour index (Faiss) over a finished
output's vector column, with the output's provenance and a measured recall.

The output's committed parts (from its ``_SUCCESS`` manifest) are read one batch at a
time, so memory beyond the index itself stays bounded:

- the recall queries (and, for IVF-PQ, its training vectors) are drawn at uniformly random
  positions across the whole output, not its first rows;
- every valid vector is added (its position is its Faiss id; the id column is stored
  beside the index as ``<index>.ids.parquet``, so string ids need no hashing);
- recall@k is measured against exact search: for flat and HNSW by brute force over the
  vectors the index stores (one pass over the output); for IVF-PQ, which keeps only
  codes, a first pass samples training vectors and queries and the exact top-k is kept in
  a heap while the parts stream by (two passes).

A row whose vector is null, of another dimension or not finite is an error record in
``<index>.errors.jsonl`` (file, row, reason), never in the index. The index, its ids and
``<index>.json`` (provenance, parameters, figures) are each written atomically, the JSON
last: a reader that finds the JSON finds a whole index. A killed build restarts from the
beginning: adding vectors costs seconds to minutes against the hours the embeddings
took, and a restart cannot leave an index that holds a part twice.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.errors import OutputError, QualityGateError, SourceError
from ..engines.ann import load_faiss, valid_vectors
from ..finished.read import Part, finished_output, normalise, part_batches
from ..sinks.files import write_bytes

__all__ = ["IndexReport", "IndexSpec", "build_index", "describe_params"]

log = logging.getLogger("bulkinfer")

Kind = Literal["flat", "hnsw", "ivf-pq"]
Metric = Literal["cosine", "ip", "l2"]


@dataclass
class IndexSpec:
    """What to build; None parameters are chosen from the data's size and dimension."""

    column: str = "embedding"
    kind: Kind = "hnsw"
    metric: Metric = "cosine"
    k: int = 10
    queries: int = 200
    hnsw_m: int | None = None
    ef_construction: int | None = None
    ef_search: int | None = None
    nlist: int | None = None
    pq_m: int | None = None
    nprobe: int | None = None
    seed: int = 0


@dataclass
class IndexReport:
    index: str
    kind: str
    metric: str
    dim: int
    vectors: int
    rows_failed: int
    params: dict[str, int] = field(default_factory=dict)
    recall: float = 0.0
    k: int = 10
    queries: int = 0
    build_s: float = 0.0
    index_bytes: int = 0
    queries_per_s: float = 0.0


# -- building -----------------------------------------------------------------------------
def _params(spec: IndexSpec, n: int, dim: int) -> dict[str, int]:
    if spec.kind == "hnsw":
        return {
            "M": spec.hnsw_m or 32,
            "ef_construction": spec.ef_construction or 80,
            "ef_search": spec.ef_search or 64,
        }
    if spec.kind == "ivf-pq":
        nlist = _nlist(spec, n)
        # two dimensions per sub-quantizer: 8x smaller than float32, and a recall that a gate can accept
        pq_m = spec.pq_m or next(m for m in (dim // 2, dim // 4, dim, 1) if m >= 1 and dim % m == 0)
        nbits = 8 if n >= 256 * 39 else max(4, int(math.log2(max(n // 39, 16))))
        return {"nlist": nlist, "pq_m": pq_m, "nbits": nbits, "nprobe": spec.nprobe or min(nlist, max(8, nlist // 8))}
    return {}


def _nlist(spec: IndexSpec, n: int) -> int:
    nlist = spec.nlist or int(min(65536, max(16, 4 * math.sqrt(max(n, 1)))))
    return min(nlist, max(1, n // 39))  # Faiss wants ~39 training points per list


def _new_index(spec: IndexSpec, dim: int, params: dict[str, int]) -> Any:
    faiss = load_faiss()
    metric = faiss.METRIC_L2 if spec.metric == "l2" else faiss.METRIC_INNER_PRODUCT
    if spec.kind == "flat":
        return faiss.IndexFlat(dim, metric)
    if spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["M"], metric)
        index.hnsw.efConstruction = params["ef_construction"]
        index.hnsw.efSearch = params["ef_search"]
        return index
    quantizer = faiss.IndexFlat(dim, metric)
    index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["pq_m"], params["nbits"], metric)
    index.nprobe = params["nprobe"]
    # Faiss prints a line per k-means (one per sub-quantizer: hundreds) when there are fewer than
    # ~39 training points per centroid; bulkinfer says it once (build_index) and measures the recall
    index.cp.min_points_per_centroid = 1
    index.pq.cp.min_points_per_centroid = 1
    return index


def describe_params(params: dict[str, int]) -> str:
    """An index's parameters as a person reads them: ``M=32, ef_construction=80, ef_search=64``."""
    return ", ".join(f"{k}={v}" for k, v in params.items())


def few_training_points(params: dict[str, int], n_train: int) -> str | None:
    """One line when IVF-PQ trains on fewer points than Faiss wants (~39 per centroid), else None."""
    want = 39 * max(params["nlist"], 2 ** params["nbits"])
    if n_train >= want:
        return None
    return (
        f"ivf-pq trains on {n_train} vectors, under the ~{want} Faiss wants for {params['nlist']} lists and "
        f"{2 ** params['nbits']} codes per sub-quantizer: the measured recall says what it costs "
        "(flat or hnsw suit an output this small)"
    )


def _prepare(spec: IndexSpec, mat: np.ndarray) -> np.ndarray:
    if spec.metric == "cosine" and len(mat):
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        mat = mat / np.where(norms == 0, 1, norms)
    return np.ascontiguousarray(mat, dtype=np.float32)


def build_index(
    output: str | Path,
    dest: str | Path,
    spec: IndexSpec,
    min_recall: float | None = None,
    on_rows: Callable[[int, int], None] = lambda done, total: None,
) -> IndexReport:
    """Build ``dest`` (and its ``.ids.parquet``, ``.json``) from the finished output ``output``;
    ``on_rows(done, total)`` follows the add pass (the CLI draws a bar with it)."""
    out, parts, job, id_column = _indexable(output)
    dest = Path(dest).expanduser()
    t0 = time.perf_counter()
    build = _Build(spec, out, sum(p.rows for p in parts))
    if spec.kind == "ivf-pq":
        build.train(parts)
    done = 0
    for part in parts:
        offset = 0
        for batch in part_batches(part, [spec.column, id_column]):
            build.add(part, offset, batch, id_column)
            offset += batch.num_rows
            done += batch.num_rows
            on_rows(done, build.n_rows)
    queries, truth = build.exact_answers()
    recall, qps = _recall(build.index, queries, truth, spec.k)
    if min_recall is not None and recall < min_recall:
        raise QualityGateError(
            f"{dest}: recall@{spec.k} is {recall:.4f}, under --min-recall {min_recall} "
            f"({spec.kind}, {describe_params(build.params)}); "
            "not written. Raise ef_search / nprobe, or build another kind"
        )
    report = IndexReport(
        index=str(dest), kind=spec.kind, metric=spec.metric, dim=build.dim or 0, vectors=build.added,
        rows_failed=len(build.errors), params=build.params, recall=round(recall, 4), k=spec.k,
        queries=len(queries), build_s=round(time.perf_counter() - t0, 3), queries_per_s=round(qps, 1),
    )  # fmt: skip
    _write(dest, build, pa.table({id_column: pa.concat_arrays(build.ids)}), report, _provenance(out, job, spec))
    return report


def _indexable(output: str | Path) -> tuple[str, list[Part], dict[str, Any], str]:
    """The finished output's location, parts, job and id column; refused when it has no id
    column or no rows."""
    out = normalise(output)
    parts, job = finished_output(out)
    id_column = job.get("config", {}).get("source", {}).get("id_column")
    if not id_column:
        raise SourceError(f"{out}: the run had no source.id_column; an index maps neighbours back to ids", out)
    if sum(p.rows for p in parts) == 0:
        raise SourceError(f"{out}: the output holds no rows to index", out)
    return out, parts, job, id_column


class _Build:
    """One index being built. IVF-PQ keeps no full vectors: a first pass (:meth:`train`) samples
    its training vectors and the queries, and the exact answer is kept in a heap while adding.
    Flat and HNSW keep the vectors, so one pass adds them and picks the queries up; exact search
    runs on the stored vectors."""

    def __init__(self, spec: IndexSpec, out: str, n_rows: int) -> None:
        self.faiss = load_faiss()
        self.spec, self.out, self.n_rows = spec, out, n_rows
        self.rng = np.random.default_rng(spec.seed)
        self.n_queries = min(spec.queries, n_rows)
        self.metric = self.faiss.METRIC_L2 if spec.metric == "l2" else self.faiss.METRIC_INNER_PRODUCT
        self.index: Any = None
        self.dim: int | None = None
        self.params: dict[str, int] = {}
        self.exact: Any = None
        self.queries = np.zeros((0, 0), dtype=np.float32)
        self.query_at: set[int] = set()
        if spec.kind != "ivf-pq":  # else train() draws them from its sample
            self.query_at = set(self.rng.choice(n_rows, size=self.n_queries, replace=False).tolist())
        self.picked: list[np.ndarray] = []
        self.ids: list[pa.Array] = []
        self.errors: list[dict[str, Any]] = []
        self.added = 0

    def _no_vector(self) -> SourceError:
        return SourceError(f"{self.out}: column {self.spec.column!r} holds no valid vector", self.out)

    def _create(self, dim: int) -> None:
        self.dim, self.params = dim, _params(self.spec, self.n_rows, dim)
        self.index = _new_index(self.spec, dim, self.params)

    def train(self, parts: list[Part]) -> None:
        """IVF-PQ: train on a uniform sample of the output; its queries come from the same sample."""
        spec, n_rows = self.spec, self.n_rows
        n_train = min(n_rows, max(256 * 64, 40 * _nlist(spec, n_rows)))
        wanted = np.sort(self.rng.choice(n_rows, size=max(n_train, self.n_queries), replace=False))
        sample, dim = _gather(parts, spec.column, wanted)
        if dim is None or not len(sample):
            raise self._no_vector()
        sample = _prepare(spec, sample)
        self.queries = sample[self.rng.permutation(len(sample))[: self.n_queries]]
        self._create(dim)
        if (few := few_training_points(self.params, len(sample))) is not None:
            log.warning("%s", few)
        self.index.train(sample)
        self.exact = self.faiss.ResultHeap(len(self.queries), spec.k, keep_max=spec.metric != "l2")

    def add(self, part: Part, offset: int, batch: pa.RecordBatch, id_column: str) -> None:
        """Add a batch's valid vectors (the others are error rows) and keep what recall needs."""
        mat, keep, reasons = valid_vectors(batch.column(self.spec.column), self.dim)
        self.errors += [{"file": part.name, "row": offset + i, "error": why} for i, why in enumerate(reasons) if why]
        mat = _prepare(self.spec, mat)
        if not len(mat):
            return
        if self.index is None:
            self._create(mat.shape[1])
        self.index.add(mat)
        self.ids.append(batch.column(id_column).take(pa.array(keep)))
        if self.exact is not None:
            flat = self.faiss.IndexFlat(self.dim, self.metric)
            flat.add(mat)
            dist, lab = flat.search(self.queries, min(self.spec.k, len(mat)))
            self.exact.add_result(dist, np.where(lab >= 0, lab + self.added, -1))
        else:
            first = part.first + offset
            mine = [j for j, row in enumerate(keep.tolist()) if first + row in self.query_at]
            if mine:
                self.picked.append(mat[mine])
        self.added += len(mat)

    def exact_answers(self) -> tuple[np.ndarray, np.ndarray]:
        """The recall queries and their exact top-k (brute force over the stored vectors, or the heap)."""
        if self.added == 0 or self.index is None or self.dim is None:
            raise self._no_vector()
        if self.exact is not None:
            self.exact.finalize()
            return self.queries, self.exact.I
        index = self.index
        queries = np.vstack(self.picked) if self.picked else index.reconstruct_n(0, min(self.n_queries, index.ntotal))
        stored = index if self.spec.kind == "flat" else self.faiss.downcast_index(index.storage)
        _, truth = stored.search(queries, self.spec.k)
        return queries, truth


def _recall(index: Any, queries: np.ndarray, truth: np.ndarray, k: int) -> tuple[float, float]:
    """recall@k against exact search (of the true neighbours there are: an output of fewer
    vectors than k has fewer than k of them), and the query rate."""
    t_q = time.perf_counter()
    _, found = index.search(queries, k)
    qps = len(queries) / max(time.perf_counter() - t_q, 1e-9)
    pairs = zip(found, truth, strict=True)
    hits = [len(set(f[f >= 0]) & set(e[e >= 0])) / max(1, int((e >= 0).sum())) for f, e in pairs]
    return float(np.mean(hits)), qps


def _provenance(out: str, job: dict[str, Any], spec: IndexSpec) -> dict[str, Any]:
    config = job.get("config", {})
    model = config.get("model", {})
    return {
        "bulkinfer_index": 1,
        "source": out,
        "job_fingerprint": job.get("fingerprint"),
        "model": {**job.get("model", {}), "digest": job.get("model_digest"), "name": model.get("name"),
                  "text_column": model.get("text_column")},
        "column": spec.column,
        "id_column": config.get("source", {}).get("id_column"),
    }  # fmt: skip


def _write(dest: Path, build: _Build, ids: pa.Table, report: IndexReport, meta: dict[str, Any]) -> None:
    """Write the index, its ids, its errors, then the JSON that makes it whole (each atomically)."""
    folder = dest.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{folder}: cannot create it ({exc.strerror or exc})") from exc

    def save(name: str, data: bytes, what: str) -> None:
        write_bytes(folder, name, data, 0, crash_at=None, what=what)

    temp = folder / f".{dest.name}.tmp-{os.getpid()}"  # streamed by Faiss: an index may be larger than memory twice
    try:
        build.faiss.write_index(build.index, str(temp))
        os.replace(temp, dest)
    except (OSError, RuntimeError) as exc:
        temp.unlink(missing_ok=True)
        raise OutputError(f"{dest}: cannot write the index ({' '.join(str(exc).split())[:200]})") from exc
    ids_buffer = pa.BufferOutputStream()
    pq.write_table(ids, ids_buffer)
    save(f"{dest.name}.ids.parquet", ids_buffer.getvalue().to_pybytes(), "the index's ids")
    if build.errors:
        errors = "".join(json.dumps(e) + "\n" for e in build.errors).encode()
        save(f"{dest.name}.errors.jsonl", errors, "its error rows")
    report.index_bytes = dest.stat().st_size
    whole = json.dumps({**meta, "report": asdict(report)}, indent=1).encode()
    save(f"{dest.name}.json", whole, "the index's provenance")


def _gather(parts: list[Part], column: str, positions: np.ndarray) -> tuple[np.ndarray, int | None]:
    """The valid vectors at global ``positions`` (sorted), and the output's dimension."""
    rows: list[np.ndarray] = []
    dim: int | None = None
    for part in parts:
        lo, hi = np.searchsorted(positions, [part.first, part.first + part.rows])
        if lo == hi:
            continue
        local = positions[lo:hi] - part.first
        offset = 0
        for batch in part_batches(part, [column]):
            mine = local[(local >= offset) & (local < offset + batch.num_rows)] - offset
            if len(mine):
                mat, _, _ = valid_vectors(batch.column(column).take(pa.array(mine)), dim)  # the first vector sets dim
                if len(mat):
                    dim = mat.shape[1]
                    rows.append(mat)
            offset += batch.num_rows
    if dim is None:
        return np.zeros((0, 0), dtype=np.float32), None
    return (np.vstack(rows) if rows else np.zeros((0, dim), dtype=np.float32)), dim
