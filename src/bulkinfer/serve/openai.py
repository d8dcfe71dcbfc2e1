"""The OpenAI-compatible route: ``POST /v1/embeddings`` (a string or a list of strings in;
float or base64 vectors out; usage counted by the model's own tokenizer), so the
``openai`` client works against bulkinfer unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from ..adapters import to_numpy_column
from ..llm.openai_api import BadRequest, embeddings_body, embeddings_inputs
from .validation import JSONResponse, bad_request, read_body

if TYPE_CHECKING:
    from .server import Server

__all__ = ["embeddings"]


async def embeddings(server: Server, request: Request) -> Response:
    # mounted only for a text-embedding model (app._unserved)
    body = await read_body(request, server.sv.max_body_bytes)
    try:
        texts, fmt = embeddings_inputs(body, server.model_names, getattr(server.adapter, "dimension", None))
    except BadRequest as exc:  # as a Batch file's line with the same body is refused: a 400 naming the field
        raise bad_request(exc) from None
    text_column = server.adapter.input_columns[0]
    table = server.check_rows([{text_column: t} for t in texts])
    answer = await server.infer(table, rows="input")
    matrix = to_numpy_column(answer.columns["embedding"]).astype(np.float32, copy=False)
    return JSONResponse(embeddings_body(matrix, server.model_names[0], answer.tokens or 0, fmt))
