"""Text embeddings from a sentence-transformers model directory.

Reads the directory the way sentence-transformers does (``modules.json``, the
transformer at the module's path, ``1_Pooling/config.json``, a ``Normalize`` module,
``sentence_bert_config.json`` for ``max_seq_length``) and runs the transformer on the
configured engine. Output: ``embedding``, a fixed-size list of float32.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ModelError
from .protocol import Adapter, RowsRejected, SetupContext
from .tokenizer import load_tokenizer

__all__ = ["TextEmbeddingAdapter", "is_sentence_transformers_dir"]

_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")


def is_sentence_transformers_dir(path: Path) -> bool:
    return path.is_dir() and (path / "modules.json").is_file()


@dataclass(frozen=True)
class _Layout:
    transformer_dir: Path
    pooling: str
    normalize: bool
    max_seq_length: int | None
    do_lower_case: bool
    dimension: int | None = None  # the embedding's size (the pooling's word_embedding_dimension)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read ({exc})") from exc
    return data if isinstance(data, dict) else {"modules": data}


def _read_layout(root: Path) -> _Layout:
    modules = _read_json(root / "modules.json")["modules"]
    transformer_dir, pooling, normalize, dimension = root, "mean_tokens", False, None
    for mod in modules:
        kind = str(mod.get("type", "")).rsplit(".", 1)[-1]
        where = root / mod.get("path", "")
        if kind == "Transformer":
            transformer_dir = where
        elif kind == "Pooling":
            cfg = _read_json(where / "config.json")
            chosen = [m for m in _POOLING_MODES if cfg.get(f"pooling_mode_{m}")]
            if len(chosen) != 1:
                raise ModelError(
                    f"{where}: pooling {chosen or 'none'} is not supported; use one of {', '.join(_POOLING_MODES)}"
                )
            pooling = chosen[0]
            dimension = cfg.get("word_embedding_dimension")
        elif kind == "Normalize":
            normalize = True
        else:
            raise ModelError(f"{root}: module type {kind!r} is not supported by the text adapter")
    st_cfg_path = transformer_dir / "sentence_bert_config.json"
    st_cfg = _read_json(st_cfg_path) if st_cfg_path.is_file() else {}
    if dimension is None and (transformer_dir / "config.json").is_file():
        dimension = _read_json(transformer_dir / "config.json").get("hidden_size")
    return _Layout(
        transformer_dir, pooling, normalize, st_cfg.get("max_seq_length"), bool(st_cfg.get("do_lower_case", False)),
        int(dimension) if isinstance(dimension, int) else None,
    )  # fmt: skip


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Sentence vectors from token vectors, the way sentence-transformers' Pooling does."""
    m = mask[..., None].astype(hidden.dtype)
    if mode == "cls_token":
        return hidden[:, 0]
    if mode == "max_tokens":
        return np.where(m > 0, hidden, np.finfo(hidden.dtype).min).max(axis=1)
    if mode == "lasttoken":
        last = mask.sum(axis=1) - 1
        return hidden[np.arange(len(hidden)), last]
    summed = (hidden * m).sum(axis=1)
    counts = np.clip(m.sum(axis=1), 1e-9, None)
    if mode == "mean_sqrt_len_tokens":
        return summed / np.sqrt(counts)
    return summed / counts


class TokenRows(list[list[int]]):
    """Token ids per row, and how many rows were cut to the model's limit (``report.json``'s
    ``rows_truncated``)."""

    truncated: int = 0


class TextEmbeddingAdapter(Adapter):
    """Embeds ``text_column`` with a sentence-transformers model directory."""

    def __init__(
        self,
        model_dir: str | Path,
        text_column: str,
        *,
        engine: str = "torch",
        precision: str = "fp32",
        max_seq_length: int | None = None,
        model_digest: str = "",
        cache_dir: str | None = None,
        int8_fp32_groups: Sequence[str] | None = None,
        tensorrt_rows: int | None = None,
        refuse_overflow: bool = False,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.refuse_overflow = refuse_overflow  # a text over max_seq_length: an error, not its first tokens
        self.tensorrt_rows = tensorrt_rows  # onnxruntime through TensorRT, for calls of up to this many rows
        self.int8_fp32_groups = list(int8_fp32_groups or [])
        if not is_sentence_transformers_dir(self.model_dir):
            raise ModelError(f"{model_dir}: not a sentence-transformers directory (no modules.json)")
        self.text_column = text_column
        self.input_columns = (text_column,)
        self.output_columns = ["embedding"]
        self.engine_name = engine
        self.precision = precision
        self.model_digest = model_digest
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.layout = _read_layout(self.model_dir)
        self.max_seq_length = max_seq_length or self.layout.max_seq_length
        self._tokenizer: Any = None
        self._engine: Any = None
        self.runs_on: str | None = None  # the engine and provider or device it ran on, once set up
        self.dimension: int | None = self.layout.dimension

    def setup(self, ctx: SetupContext) -> None:
        from ..core.hardware import feed_the_gpu

        feed_the_gpu(ctx.device)
        try:
            tok = load_tokenizer(self.layout.transformer_dir)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{self.layout.transformer_dir}: cannot load the tokenizer ({exc})") from exc
        if self.max_seq_length is None:
            self.max_seq_length = min(int(tok.model_max_length), 512)
        self._tokenizer = tok
        self._ctx = ctx
        self.reload_engine(self.int8_fp32_groups)

    def reload_engine(self, int8_fp32_groups: Sequence[str]) -> None:
        """(Re)load the engine, int8 with ``int8_fp32_groups`` kept in fp32 (the gate's search)."""
        from ..engines import load_engine

        ctx = self._ctx
        self.int8_fp32_groups = list(int8_fp32_groups)
        self._engine = load_engine(
            self.engine_name,
            str(self.layout.transformer_dir),
            device=ctx.device,
            threads=ctx.threads,
            precision=self.precision,
            model_digest=self.model_digest,
            cache_dir=self.cache_dir,
            spin=not ctx.online,
            keep_fp32=self.int8_fp32_groups,
            tensorrt=(self.tensorrt_rows, self.max_seq_length or 512) if self.tensorrt_rows else None,
        )
        self.runs_on = getattr(self._engine, "runs_on", None)
        self.build_split: dict[str, float] = dict(getattr(self._engine, "build_split", {}))

    def preprocess(self, table: pa.Table) -> list[list[int]]:
        texts = table.column(self.text_column).to_pylist()
        if any(t is None for t in texts):
            raise ValueError(f"null text in column {self.text_column!r}")
        if any(isinstance(t, bytes) for t in texts):  # CSV/Parquet bytes that are not valid UTF-8 strings
            texts = [t.decode("utf-8") if isinstance(t, bytes) else t for t in texts]  # raises on bad bytes
        # a token is at least one character: longer texts are cut before tokenizing, for speed
        limit = 64 * (self.max_seq_length or 512)
        clean = [str(t)[:limit].strip() for t in texts]
        if self.layout.do_lower_case:
            clean = [t.lower() for t in clean]
        limit = int(self.max_seq_length or 512)
        enc = self._tokenizer(  # one token over the limit: the rows that reach it are the ones cut
            clean,
            truncation=True,
            max_length=limit + 1,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        ids = TokenRows(enc["input_ids"])
        over = [i for i, seq in enumerate(ids) if len(seq) > limit]
        if over and self.refuse_overflow:
            raise RowsRejected({i: ValueError(self._over_limit(str(texts[i]), limit)) for i in over})
        special = set(self._tokenizer.all_special_ids)
        for i in over:  # what truncating at the limit gives: the first tokens (and the closing special token)
            seq = ids[i]
            ids[i] = seq[: limit - 1] + seq[-1:] if seq[-1] in special else seq[:limit]
        ids.truncated = len(over)
        return ids

    def _over_limit(self, text: str, limit: int) -> str:
        n = len(self._tokenizer(text, truncation=False, return_attention_mask=False)["input_ids"])
        return (
            f"the text has {n} tokens, over the model's limit of {limit}; shorten it, or set model.truncate = true "
            f"to embed its first {limit} tokens"
        )

    def cost(self, features: Any) -> Sequence[int]:
        return [len(x) for x in features]

    def select(self, features: Any, indices: np.ndarray) -> dict[str, np.ndarray]:
        rows = [features[i] for i in indices]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self._tokenizer.pad_token_id or 0, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, seq in enumerate(rows):
            ids[r, : len(seq)] = seq
            mask[r, : len(seq)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def predict(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        embed = getattr(self._engine, "embed", None)
        if embed is not None:  # torch: pooled where the model ran (on a GPU only vectors come back)
            out: np.ndarray = embed(batch["input_ids"], batch["attention_mask"], self.layout.pooling,
                                    self.layout.normalize)  # fmt: skip
            return out
        hidden = self._engine.forward(batch["input_ids"], batch["attention_mask"])
        vectors = pool(hidden, batch["attention_mask"], self.layout.pooling).astype(np.float32)
        if self.layout.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.clip(norms, 1e-12, None)
        return vectors

    def postprocess(self, outputs: Any) -> Mapping[str, Any]:
        return {"embedding": outputs}
