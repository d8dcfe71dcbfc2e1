"""``/v1/moderations`` requests of an OpenAI batch file (``bulkinfer run`` over one, the batch
service's batches), answered by a job's models: each request's inputs are rows of the models'
window with the other requests' (pictures decoded once, as any picture job), and the answer is
the API's moderation body (:mod:`bulkinfer.llm.moderation`, the same as ``serve``'s).

:func:`category_kinds` checks a ``[moderation]`` section against the models at start: every
category mapped, each score over columns its models write, a model reading the request's text
or picture."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..config import JobConfig
from ..config.moderation import ModerationConfig
from ..core.batching import take_spans
from ..core.errors import ConfigError
from ..core.expr import columns, parse
from ..llm.moderation import moderation_body, moderation_rows
from ..llm.openai_api import BadRequest, batch_request, dumps
from .ensemble import Ensemble, check_columns, input_kinds
from .generate import REQUEST_COLUMNS
from .protocol import Adapter, RowsRejected, SetupContext

__all__ = ["MODERATIONS", "ModerationRequests", "category_kinds"]

MODERATIONS = "/v1/moderations"
MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""A batch line's picture at most (a data URL inside the line; the file's own limit holds too)."""


def category_kinds(cfg: JobConfig, adapter: Adapter) -> dict[str, set[str]]:
    """The input types (text, image) each category's models read; a category, score or input
    column that cannot be answered is refused, naming it."""
    mod = cfg.moderation
    assert mod is not None
    if not isinstance(adapter, Ensemble):
        raise ConfigError(
            "moderation: the categories are scores over [models.<name>] columns; put the model in a "
            "[models.<name>] table"
        )
    mod.check()
    if mod.text_column not in adapter.input_columns and mod.image_column not in adapter.input_columns:
        raise ConfigError(
            f"moderation: no model reads {mod.text_column!r} (moderation.text_column) or {mod.image_column!r} "
            f"(moderation.image_column); the models read {', '.join(adapter.input_columns)}"
        )
    kinds = input_kinds(adapter.members)
    out = {}
    for category, mapped in mod.categories.items():
        where = f"moderation.categories.{category}.score"
        expr = parse(mapped.score, where)
        check_columns(expr, adapter.members, where)
        owners = {c.split(".", 1)[0] for c in columns(expr)}
        out[category] = set().union(*(kinds[o] for o in owners if o in kinds))
    return out


def request_table(rows: Sequence[Mapping[str, Any]], mod: ModerationConfig, inputs: Sequence[str]) -> pa.Table:
    """Moderation rows as the models' input: the text and picture columns, any other input null."""
    table = {c: pa.nulls(len(rows), pa.string()) for c in inputs}
    table[mod.text_column] = pa.array([r[mod.text_column] for r in rows], pa.string())
    table[mod.image_column] = pa.array([r[mod.image_column] for r in rows], pa.binary())
    return pa.table(table)


@dataclass
class _Requests:
    table: pa.Table  # every input of every request, as rows of the models' input
    features: Any  # the models' features of those rows
    spans: list[tuple[int, int]]  # each request's rows


class ModerationRequests(Adapter):
    """Batch-file moderation requests over a job's models (an :class:`Ensemble`, or one shared)."""

    input_columns = REQUEST_COLUMNS

    def __init__(self, inner: Any, names: Sequence[str], mod: ModerationConfig, kinds: Mapping[str, set[str]]) -> None:
        self.inner, self.names, self.mod, self.kinds = inner, list(names), mod, kinds
        self.batch_size_hint = getattr(inner, "batch_size_hint", None)
        self.window_rows = getattr(inner, "window_rows", None)

    def setup(self, ctx: SetupContext) -> None:
        self.inner.setup(ctx)

    def preprocess(self, table: pa.Table) -> _Requests:
        rejected: dict[int, Exception] = {}
        rows: list[dict[str, Any]] = []
        spans = []
        for pos, line in enumerate(table.select(list(REQUEST_COLUMNS)).to_pylist()):
            try:
                url, body = batch_request(line)
                if url != MODERATIONS:
                    raise BadRequest(f"url: this job's models answer {MODERATIONS}", "url")
                mine = moderation_rows(body, self.names, self.mod, MAX_IMAGE_BYTES)
            except BadRequest as exc:
                rejected[pos] = exc
                continue
            spans.append((len(rows), len(rows) + len(mine)))
            rows.extend(mine)
        if rejected:
            raise RowsRejected(rejected)
        table = request_table(rows, self.mod, self.inner.input_columns)
        try:
            features = self.inner.preprocess(table)
        except RowsRejected as exc:  # a picture that does not decode: its request is refused, naming it
            owner = {r: pos for pos, (a, b) in enumerate(spans) for r in range(a, b)}
            raise RowsRejected({owner[r]: BadRequest(f"input: {e}", "input") for r, e in exc.errors.items()}) from None
        return _Requests(table, features, spans)

    def select(self, features: _Requests, indices: np.ndarray) -> _Requests:
        rows, spans = take_spans(features.spans, indices)
        return _Requests(features.table.take(pa.array(rows)), self.inner.select(features.features, rows), spans)

    def predict(self, batch: _Requests) -> Mapping[str, Any]:
        table = batch.table
        for name, column in self.inner.postprocess(self.inner.predict(batch.features)).items():
            table = table.append_column(name, column)
        bodies = [dumps(moderation_body(table.slice(a, b - a), self.mod, self.kinds, self.names[0]))
                  for a, b in batch.spans]  # fmt: skip
        return {"response": bodies, "prompt_tokens": [0] * len(bodies), "completion_tokens": [0] * len(bodies)}

    def close(self) -> None:
        self.inner.close()
