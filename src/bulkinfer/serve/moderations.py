"""``POST /v1/moderations``: OpenAI's moderations API over a job's models (``[models]``), its
categories scored by ``[moderation]`` (:mod:`bulkinfer.llm.moderation`), checked at start by
:func:`bulkinfer.adapters.moderation_requests.category_kinds`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from ..adapters.moderation_requests import request_table
from ..llm.moderation import moderation_body, moderation_rows
from ..llm.openai_api import BadRequest
from .validation import JSONResponse, bad_request, read_body

if TYPE_CHECKING:
    from .server import Server

__all__ = ["moderations"]


async def moderations(server: Server, request: Request) -> Response:
    mod = server.cfg.moderation
    assert mod is not None and server.moderation_kinds is not None  # the route exists only then
    body = await read_body(request, server.sv.max_body_bytes)
    try:
        rows = moderation_rows(body, server.model_names, mod, server.sv.max_image_bytes)
    except BadRequest as exc:
        raise bad_request(exc) from None
    table = request_table(rows, mod, server.adapter.input_columns)
    answer = await server.infer(table, rows="input")
    for name, column in answer.columns.items():
        table = table.append_column(name, column)
    return JSONResponse(moderation_body(table, mod, server.moderation_kinds, server.model_names[0]))
