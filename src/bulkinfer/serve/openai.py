"""The OpenAI-compatible route: ``POST /v1/embeddings`` (a string or a list of strings in;
float or base64 vectors out; usage counted by the model's own tokenizer), so the
``openai`` client works against bulkinfer unchanged."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from ..adapters import to_numpy_column
from .validation import ApiError, JSONResponse, read_body

if TYPE_CHECKING:
    from .app import Server

__all__ = ["embeddings"]


async def embeddings(server: Server, request: Request) -> Response:
    if server.model.kind != "text-embedding":
        raise ApiError(404, "this model makes no embeddings; use POST /v1/predict", "not_found")
    body = await read_body(request, server.sv.max_body_bytes)
    if not isinstance(body, dict):
        raise ApiError(422, "body: expected an object with input", "invalid_request")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(422, "input: expected a string or a non-empty list of strings", "invalid_request")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(422, f"encoding_format: expected float or base64, got {fmt!r}", "invalid_request")
    text_column = server.adapter.input_columns[0]
    table = server.check_rows([{text_column: t} for t in texts])
    answer = await server.infer(table)
    matrix = to_numpy_column(answer.columns["embedding"]).astype(np.float32, copy=False)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec,
        }
        for i, vec in enumerate(matrix)
    ]
    usage = {"prompt_tokens": answer.tokens or 0, "total_tokens": answer.tokens or 0}
    return JSONResponse({"object": "list", "data": data, "model": body.get("model") or server.name, "usage": usage})
