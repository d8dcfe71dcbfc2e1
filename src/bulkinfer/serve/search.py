"""``POST /v1/search``: nearest neighbours from the index the server was started with
(``bulkinfer serve --model items.index``), the query a text (embedded by the index's own
model, as offline) or a vector.

::

    {"query": "red running shoes", "k": 5, "exclude": ["item-3"]}
    {"queries": [[0.1, ...], [0.3, ...]], "k": 5}
    -> {"results": [{"ids": [...], "scores": [...]}, ...], "index": "items.index"}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .validation import ApiError, JSONResponse, json_type, read_body

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from .server import Server

__all__ = ["search"]


async def search(server: Server, request: Request) -> Response:
    from ..adapters.knn import ONLINE_EXCLUDE, ONLINE_K, KnnAdapter

    adapter = server.adapter
    assert isinstance(adapter, KnnAdapter)  # mounted only over an index (app._unserved)
    server.ready_batcher()  # 503 while the index is loading
    assert adapter.ids is not None
    body = await read_body(request, server.sv.max_body_bytes)
    if not isinstance(body, dict):
        raise ApiError(422, "body: expected an object with query or queries", "invalid_request")
    queries = body.get("queries", [body["query"]] if "query" in body else None)
    if not isinstance(queries, list) or not queries:
        raise ApiError(422, "query: give a text or a vector (or queries: a list of them)", "invalid_request")
    k = body.get("k", adapter.k)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= adapter.k:
        raise ApiError(422, f"k: expected a whole number from 1 to {adapter.k} (the server's --k)", "invalid_request")
    exclude = body.get("exclude", [])
    if not isinstance(exclude, list):
        raise ApiError(422, f"exclude: expected a list of ids, got {json_type(exclude)}", "invalid_request")
    text = adapter.text is not None
    for i, q in enumerate(queries):
        ok = isinstance(q, str) if text else isinstance(q, list) and all(_number(x) for x in q)
        if not ok:
            want = "a string" if text else "a list of numbers"
            raise ApiError(422, f"queries[{i}]: expected {want}, got {json_type(q)}", "invalid_request")
    if len(queries) > server.sv.max_rows_per_request:
        raise ApiError(413, f"queries: {len(queries)} is over serve.max_rows_per_request", "too_large")
    n = len(queries)
    vectors = pa.array(queries) if text else pa.array(queries, pa.list_(pa.float32()))
    columns: dict[str, Any] = {adapter.query_column: vectors}
    for col in adapter.input_columns:
        if col != adapter.query_column:  # the offline job's own-id, seen and k columns: none online
            columns[col] = pa.nulls(n)
    try:
        columns[ONLINE_EXCLUDE] = pa.array([exclude] * n, pa.list_(adapter.ids.type))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise ApiError(
            422, f"exclude: the index's ids are {adapter.ids.type}, not {json_type(exclude[0])}", "invalid_request"
        ) from None
    columns[ONLINE_K] = pa.array([k] * n, pa.int64())
    answer = await server.infer(pa.table(columns))
    neighbors, scores = answer.columns["neighbors"].to_pylist(), answer.columns["scores"].to_pylist()
    out = [{"ids": ids, "scores": sc} for ids, sc in zip(neighbors, scores, strict=True)]
    return JSONResponse({"index": str(adapter.path.name), "results": out})


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
