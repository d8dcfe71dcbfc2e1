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
import pyarrow.parquet as pq

from ..errors import ConfigError, ModelError
from .base import Adapter, SetupContext, predict_table

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
        from ..index import load_index_meta

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
        self._stamp = 0.0

    def _text_model(self, cfg: JobConfig) -> Adapter:
        from . import _digest_path
        from .text import TextEmbeddingAdapter

        model = self.meta["model"]
        if model.get("kind") != "text-embedding":
            raise ConfigError(
                f"model.text_column: {self.path} holds vectors of a {model.get('kind')} model "
                f"({model.get('location')}), not a text model: query with a vector column (--feature-columns)"
            )
        location = Path(model["location"])
        if not location.exists() or _digest_path(location) != model.get("digest"):
            raise ModelError(
                f"{self.path}: built from embeddings of {location} (digest {model.get('digest')}), which is gone or "
                "changed since; queries embedded now would not match: rebuild the output and the index"
            )
        from ..engines import choose_engine

        rt = cfg.runtime
        return TextEmbeddingAdapter(
            location, cfg.model.text_column or "", engine=choose_engine(rt.engine, rt.precision, rt.device),
            precision=rt.precision, max_seq_length=cfg.model.max_seq_length, model_digest=model.get("digest", ""),
            cache_dir=rt.cache_dir,
        )  # fmt: skip

    def setup(self, ctx: SetupContext) -> None:
        from ..index import _faiss

        _faiss().omp_set_num_threads(max(1, ctx.threads))
        self._loaded, self._stamp = self._load()
        if self.text is not None:
            self.text.setup(ctx)

    @property
    def ids(self) -> pa.Array | None:
        return self._loaded[1] if self._loaded else None

    def _load(self) -> tuple[tuple[Any, pa.Array], float]:
        from ..index import _faiss

        stamp = Path(f"{self.path}.json").stat().st_mtime  # the JSON is written last: a whole index is there
        try:
            index = _faiss().read_index(str(self.path))
        except RuntimeError as exc:
            raise ModelError(f"{self.path}: not a readable Faiss index ({' '.join(str(exc).split())[:200]})") from exc
        ids = pq.read_table(f"{self.path}.ids.parquet").column(0).combine_chunks()
        if index.ntotal != len(ids):
            raise ModelError(f"{self.path}: {index.ntotal} vectors but {len(ids)} ids; rebuild the index")
        return (index, ids), stamp

    def reload(self) -> bool:
        """Load the index again if a new build replaced it (``bulkinfer serve`` polls this): the new
        one is read completely, then swapped in, so requests in flight finish on the old one."""
        if Path(f"{self.path}.json").stat().st_mtime == self._stamp:
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
        from ..index import _matrix

        mat, keep, reasons = _matrix(col, None)
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
        assert self._loaded is not None
        index, all_ids = self._loaded
        queries = self._queries(batch)
        n = batch.num_rows
        own = self._values(batch, self.self_column, None)
        seen = [(a or []) + (b or []) for a, b in zip(
            self._values(batch, self.exclude_column, None), self._values(batch, ONLINE_EXCLUDE, None), strict=True
        )]  # fmt: skip
        ks = [o if o is not None else r for o, r in zip(
            self._values(batch, ONLINE_K, None), self._values(batch, self.k_column, self.k), strict=True
        )]  # fmt: skip
        extra = (1 if self.self_column else 0) + max((len(s or []) for s in seen), default=0)
        scores, labels = index.search(queries, min(self.k + extra, index.ntotal))
        ids = all_ids.take(pa.array(np.where(labels >= 0, labels, 0).ravel())).to_pylist()
        width = labels.shape[1]
        neighbors, kept_scores = [], []
        for r in range(n):
            drop = set(seen[r] or [])
            if own[r] is not None:
                drop.add(own[r])
            k = min(self.k, int(ks[r] if ks[r] is not None else self.k))
            row_ids, row_scores = [], []
            for j in range(width):
                if labels[r, j] < 0:
                    break
                item = ids[r * width + j]
                if item in drop:
                    continue
                row_ids.append(item)
                row_scores.append(float(scores[r, j]))
                if len(row_ids) == k:
                    break
            neighbors.append(row_ids)
            kept_scores.append(row_scores)
        return {
            "neighbors": pa.array(neighbors, pa.list_(all_ids.type)),
            "scores": pa.array(kept_scores, pa.list_(pa.float32())),
        }

    @staticmethod
    def _values(batch: pa.Table, column: str | None, default: Any) -> list[Any]:
        if column is None or column not in batch.column_names:
            return [default] * batch.num_rows
        return [default if v is None else v for v in batch.column(column).to_pylist()]

    def close(self) -> None:
        if self.text is not None:
            self.text.close()
