"""``POST /v1/moderations``: OpenAI's moderations API over a job's models (``[models]``), its
categories scored by ``[moderation]`` (:mod:`bulkinfer.llm.moderation`). Checked at start:
every category mapped, each score over columns its models write, and a model reading the
request's text or picture."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from starlette.requests import Request
from starlette.responses import Response

from ..adapters import Adapter
from ..adapters.ensemble import Ensemble, check_columns, input_kinds
from ..config import JobConfig
from ..core.errors import ConfigError
from ..core.expr import columns, parse
from ..llm.moderation import moderation_body, moderation_rows
from ..llm.openai_api import BadRequest
from .validation import ApiError, JSONResponse, read_body

if TYPE_CHECKING:
    from .server import Server

__all__ = ["category_kinds", "moderations"]


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


async def moderations(server: Server, request: Request) -> Response:
    mod = server.cfg.moderation
    assert mod is not None and server.moderation_kinds is not None  # the route exists only then
    body = await read_body(request, server.sv.max_body_bytes)
    try:
        rows = moderation_rows(body, server.model_names, mod, server.sv.max_image_bytes)
    except BadRequest as exc:
        raise ApiError(400, str(exc), "invalid_request_error", param=exc.param, code=exc.code) from None
    inputs = {c: [None] * len(rows) for c in server.adapter.input_columns}
    inputs[mod.text_column] = [r[mod.text_column] for r in rows]
    table = pa.table({**inputs, mod.image_column: pa.array([r[mod.image_column] for r in rows], pa.binary())})
    answer = await server.infer(table, rows="input")
    for name, column in answer.columns.items():
        table = table.append_column(name, column)
    return JSONResponse(moderation_body(table, mod, server.moderation_kinds, server.model_names[0]))
