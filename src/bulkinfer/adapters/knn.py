"""kNN as a model: ``--model items.index`` (an index ``bulkinfer index`` built) answers each
row with its top-k ``neighbors`` (the indexed output's ids) and their ``scores``, as a
normal job: sharded, exactly once, resumable, on the Ray backend too (each worker loads
the index once, in ``setup``).

The query is either a vector column (``model.feature_columns = ["embedding"]``) or a text
column (``model.text_column``), embedded first by the model the index's vectors came from
(recorded in ``<index>.json``; refused if that model's files changed since). Options
(``model.options``, or ``--k``): ``k`` (default 10), ``exclude_self`` (default true: a row
never gets its own id, by ``source.id_column``), ``exclude_column`` (a column of id lists
to leave out: what the user has already seen), ``k_column`` (a per-row k, at most ``k``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..core.errors import ConfigError, ModelError
from ..core.storage import file_version
from ..engines.ann import load_faiss, load_index_meta, valid_vectors
from .protocol import Adapter, SetupContext, predict_table

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["ONLINE_EXCLUDE", "ONLINE_K", "KnnAdapter", "is_index"]

ONLINE_EXCLUDE, ONLINE_K = "_exclude", "_k"
"""Columns ``POST /v1/search`` adds to its rows: ids to leave out and k, per request."""


def is_index(path: Path) -> bool:
    return path.is_file() and Path(f"{path}.json").is_file() and Path(f"{path}.ids.parquet").is_file()


class KnnAdapter(Adapter):
    batch_size_hint = 1024

    def __init__(self, index_path: str | Path, cfg: JobConfig) -> None:
        self.path = Path(index_path)
        self.meta = load_index_meta(self.path)
        report = self.meta["report"]
        self.metric, self.dim = report["metric"], int(report["dim"])
        opts: Mapping[str, Any] = cfg.model.options
        unknown = set(opts) - {"k", "exclude_self", "exclude_column", "k_column", "metric"}
        if unknown:
            raise ConfigError(f"model.options: {sorted(unknown)[0]!r} is not a kNN option (k, exclude_self, "
                              "exclude_column, k_column)")  # fmt: skip
        if opts.get("metric", self.metric) != self.metric:
            raise ConfigError(
                f"model.options.metric: {self.path} was built for {self.metric} similarity, not {opts['metric']}; "
                "build another index with --metric"
            )
        self.k = int(opts.get("k", 10))
        if self.k < 1:
            raise ConfigError(f"model.options.k: {self.k}; ask for at least one neighbour")
        self.self_column = cfg.source.id_column if opts.get("exclude_self", True) else None
        self.exclude_column: str | None = opts.get("exclude_column")
        self.k_column: str | None = opts.get("k_column")
        self.text: Adapter | None = None
        self.text_batch = cfg.runtime.batch_size if isinstance(cfg.runtime.batch_size, int) else 16
        if cfg.model.text_column:
            self.text = self._text_model(cfg)
            query = [cfg.model.text_column]
        elif len(cfg.model.feature_columns) == 1:
            query = list(cfg.model.feature_columns)
        else:
            raise ConfigError(
                "model.feature_columns: a kNN model needs one query: a vector column (--feature-columns embedding) "
                "or a text column to embed first (--text-column)"
            )
        self.query_column = query[0]
        extra = [c for c in (self.self_column, self.exclude_column, self.k_column) if c]
        self.input_columns = tuple(dict.fromkeys([*query, *extra]))
        self._loaded: tuple[Any, pa.Array] | None = None  # (index, ids), swapped as one by reload()
        self._stamp: tuple[int, int, int] = (0, 0, 0)

    def _text_model(self, cfg: JobConfig) -> Adapter:
        from .digest import digest_path
        from .text import TextEmbeddingAdapter

        model = self.meta["model"]
        if model.get("kind") != "text-embedding":
            raise ConfigError(
                f"model.text_column: {self.path} holds vectors of a {model.get('kind')} model "
                f"({model.get('location')}), not a text model: query with a vector column (--feature-columns)"
            )
        location = Path(model["location"])
        if not location.exists() or digest_path(location) != model.get("digest"):
            raise ModelError(
                f"{self.path}: built from embeddings of {location} (digest {model.get('digest')}), which is gone or "
                "changed since; queries embedded now would not match: rebuild the output and the index"
            )
        from ..engines import choose_engine

        rt = cfg.runtime
        engine = choose_engine(rt.engine, rt.precision, rt.device, rt.tensorrt)
        return TextEmbeddingAdapter(
            location, cfg.model.text_column or "", engine=engine,
            precision=rt.precision, max_seq_length=cfg.model.max_seq_length, model_digest=model.get("digest", ""),
            cache_dir=rt.cache_dir,
        )  # fmt: skip

    def setup(self, ctx: SetupContext) -> None:
        load_faiss().omp_set_num_threads(max(1, ctx.threads))
        self._loaded, self._stamp = self._load()
        if self.text is not None:
            self.text.setup(ctx)

    @property
    def ids(self) -> pa.Array | None:
        return self._loaded[1] if self._loaded else None

    def _load(self) -> tuple[tuple[Any, pa.Array], tuple[int, int, int]]:
        stamp = file_version(Path(f"{self.path}.json"))  # the JSON is written last: a whole index is there
        try:
            index = load_faiss().read_index(str(self.path))
        except RuntimeError as exc:
            raise ModelError(f"{self.path}: not a readable Faiss index ({' '.join(str(exc).split())[:200]})") from exc
        ids = pq.read_table(f"{self.path}.ids.parquet").column(0).combine_chunks()
        if index.ntotal != len(ids):
            raise ModelError(f"{self.path}: {index.ntotal} vectors but {len(ids)} ids; rebuild the index")
        return (index, ids), stamp

    def reload(self) -> bool:
        """Load the index again if a new build replaced it (``bulkinfer serve`` polls this): the new
        one is read completely, then swapped in, so requests in flight finish on the old one."""
        if file_version(Path(f"{self.path}.json")) == self._stamp:
            return False
        meta = json.loads(Path(f"{self.path}.json").read_text())
        if (meta["report"]["metric"], int(meta["report"]["dim"])) != (self.metric, self.dim):
            raise ModelError(f"{self.path}: the new index has another metric or dimension; restart the server")
        self._loaded, self._stamp = self._load()
        return True

    def preprocess(self, table: pa.Table) -> pa.Table:
        return table

    def cost(self, features: Any) -> Sequence[int] | None:
        return None

    def select(self, features: pa.Table, indices: np.ndarray) -> pa.Table:
        return features.take(pa.array(indices))

    def _queries(self, table: pa.Table) -> np.ndarray:
        if self.text is not None:
            col = predict_table(self.text, table, batch_size=self.text_batch)["embedding"]
        else:
            col = table.column(self.query_column).combine_chunks()
        mat, keep, reasons = valid_vectors(col, None)
        if len(keep) != len(col):
            raise ModelError(f"{self.query_column}: {next(r for r in reasons if r)} (a query)")
        if len(col) and mat.shape[1] != self.dim:
            raise ModelError(
                f"{self.query_column}: query vectors of {mat.shape[1]} dimensions; "
                f"{self.path} holds {self.dim}-dimensional ones"
            )
        if self.metric == "cosine":
            norms = np.linalg.norm(mat, axis=1, keepdims=True)
            mat = (mat / np.where(norms == 0, 1, norms)).astype(np.float32)
        return np.ascontiguousarray(mat)

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        """Search k plus as many as can be excluded, then drop the row's own id and its
        excluded ids and keep each row's first k: all of it vectorised (Arrow and numpy)."""
        assert self._loaded is not None
        index, all_ids = self._loaded
        queries = self._queries(batch)
        n = batch.num_rows
        excluded = [self._column(batch, c) for c in (self.exclude_column, ONLINE_EXCLUDE)]
        excluded = [c for c in excluded if c is not None]
        most = max((int(pc.max(pc.list_value_length(c)).as_py() or 0) for c in excluded), default=0)
        width = min(self.k + (1 if self.self_column else 0) + most, index.ntotal)
        scores, labels = index.search(queries, width)
        width = labels.shape[1]
        valid = labels >= 0
        cand = all_ids.take(pa.array(np.where(valid, labels, 0).ravel()))
        drop = np.zeros(n * width, dtype=bool)
        own = self._column(batch, self.self_column)
        if own is not None:
            own_ids = _as_type(own, all_ids.type)
            if own_ids is not None:
                same = pc.equal(cand, own_ids.take(pa.array(np.repeat(np.arange(n), width))))
                drop |= pc.fill_null(same, False).to_numpy(zero_copy_only=False)
        for col in excluded:
            drop |= _pairs_in(cand, width, col, all_ids.type)
        keep = valid & ~drop.reshape(n, width)
        ks = np.full(n, self.k, dtype=np.int64)
        for col in (self.k_column, ONLINE_K):
            given = self._column(batch, col)
            if given is not None:
                values = pc.fill_null(given.cast(pa.int64()), -1).to_numpy(zero_copy_only=False)
                ks = np.where(values >= 0, np.minimum(values, self.k), ks)
        final = keep & (np.cumsum(keep, axis=1) <= ks[:, None])
        offsets = pa.array(np.concatenate([[0], np.cumsum(final.sum(axis=1))]).astype(np.int32))
        flat = final.ravel()
        return {
            "neighbors": pa.ListArray.from_arrays(offsets, cand.filter(pa.array(flat))),
            "scores": pa.ListArray.from_arrays(offsets, pa.array(scores.ravel()[flat], pa.float32())),
        }

    @staticmethod
    def _column(batch: pa.Table, column: str | None) -> pa.Array | None:
        if column is None or column not in batch.column_names:
            return None
        col = batch.column(column).combine_chunks()
        return None if pa.types.is_null(col.type) else col

    def close(self) -> None:
        if self.text is not None:
            self.text.close()


def _as_type(col: pa.Array, to: pa.DataType) -> pa.Array | None:
    """``col`` as the index's id type, or None when its values cannot be ids of the index."""
    if col.type == to:
        return col
    try:
        return col.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _pairs_in(cand: pa.Array, width: int, lists: pa.Array, id_type: pa.DataType) -> np.ndarray:
    """For each candidate (row r, position j), whether its id is in ``lists[r]``: one semi-join
    of (row, id) pairs, whatever the id type."""
    if pa.types.is_null(lists.type) or not len(lists):
        return np.zeros(len(cand), dtype=bool)
    flat = _as_type(pc.list_flatten(lists), id_type)
    if flat is None or not len(flat):
        return np.zeros(len(cand), dtype=bool)
    listed = pa.table({"row": pc.list_parent_indices(lists).cast(pa.int64()), "id": flat})
    rows = np.repeat(np.arange(len(cand) // max(width, 1)), width)
    pairs = pa.table({"row": pa.array(rows, pa.int64()), "id": cand, "pos": pa.array(np.arange(len(cand)))})
    hits = pairs.join(listed, keys=["row", "id"], join_type="left semi").column("pos").to_numpy()
    out = np.zeros(len(cand), dtype=bool)
    out[hits] = True
    return out
