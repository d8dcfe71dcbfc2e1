"""``/v1/embeddings`` requests of an OpenAI batch file, answered by the text-embedding
adapter: each request's inputs are embedded with the other requests' (length-sorted,
batched by tokens as any text job), and the answer is the API's embeddings body."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.batching import take_spans
from ..llm.openai_api import EMBEDDINGS, BadRequest, batch_request, dumps, embeddings_body, embeddings_inputs
from .generate import REQUEST_COLUMNS
from .protocol import Adapter, RowsRejected, SetupContext, to_numpy_column

__all__ = ["EmbeddingRequests"]


@dataclass
class _Requests:
    texts: Any  # the inner adapter's features of every input of every request
    spans: list[tuple[int, int]]  # each request's inputs in ``texts``
    encodings: list[str]
    tokens: list[int]
    truncated: int = 0  # inputs cut to the model's token limit (model.truncate = true)


class EmbeddingRequests(Adapter):
    """Batch-file embeddings requests over a text-embedding adapter."""

    input_columns = REQUEST_COLUMNS

    def __init__(self, inner: Any, names: Sequence[str]) -> None:
        self.inner, self.names = inner, list(names)
        self.served_name = self.names[0]
        self.engine_name = getattr(inner, "engine_name", "torch")

    def setup(self, ctx: SetupContext) -> None:
        self.inner.setup(ctx)

    def preprocess(self, table: pa.Table) -> _Requests:
        rejected: dict[int, Exception] = {}
        texts: list[str] = []
        spans, encodings = [], []
        for pos, row in enumerate(table.select(list(REQUEST_COLUMNS)).to_pylist()):
            try:
                url, body = batch_request(row)
                if url != EMBEDDINGS:
                    raise BadRequest(f"url: this job's model makes embeddings; it answers {EMBEDDINGS}", "url")
                inputs, encoding = embeddings_inputs(body, self.names, getattr(self.inner, "dimension", None))
            except BadRequest as exc:
                rejected[pos] = exc
                continue
            spans.append((len(texts), len(texts) + len(inputs)))
            encodings.append(encoding)
            texts.extend(inputs)
        if rejected:
            raise RowsRejected(rejected)
        try:
            features = self.inner.preprocess(pa.table({self.inner.input_columns[0]: pa.array(texts, pa.string())}))
        except RowsRejected as exc:  # an input over the token limit: its request is refused, naming the input
            owner = {t: (pos, t - a) for pos, (a, b) in enumerate(spans) for t in range(a, b)}
            refused: dict[int, Exception] = {}
            for t, err in sorted(exc.errors.items()):
                pos, j = owner[t]
                refused.setdefault(pos, BadRequest(f"input[{j}]: {err}", "input"))
            raise RowsRejected(refused) from None
        costs = self.inner.cost(features)
        tokens = [sum(costs[a:b]) for a, b in spans]
        return _Requests(features, spans, encodings, tokens, getattr(features, "truncated", 0))

    def cost(self, features: _Requests) -> Sequence[int]:
        return features.tokens

    def select(self, features: _Requests, indices: np.ndarray) -> _Requests:
        rows, spans = take_spans(features.spans, indices)
        texts = self.inner.select(features.texts, rows)
        picked = [features.encodings[i] for i in indices], [features.tokens[i] for i in indices]
        return _Requests(texts, spans, *picked)

    def predict(self, batch: _Requests) -> Mapping[str, Any]:
        columns = self.inner.postprocess(self.inner.predict(batch.texts))
        vectors = columns["embedding"]
        if isinstance(vectors, pa.Array | pa.ChunkedArray):
            vectors = to_numpy_column(vectors)
        vectors = np.asarray(vectors, dtype=np.float32)
        bodies = [
            dumps(embeddings_body(vectors[a:b], self.served_name, n, enc))
            for (a, b), n, enc in zip(batch.spans, batch.tokens, batch.encodings, strict=True)
        ]
        return {"response": bodies, "prompt_tokens": batch.tokens, "completion_tokens": [0] * len(bodies)}

    def close(self) -> None:
        self.inner.close()
