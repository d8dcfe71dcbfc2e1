"""The HTTP server over a job's adapter: an ASGI app (Starlette) run by uvicorn. This
module holds the routing and the lifespan; the model behind the routes is
:class:`.server.Server`; request checks are in :mod:`.validation`, API keys in
:mod:`.auth`, the OpenAI route in :mod:`.openai`.

Routes: ``POST /v1/predict`` (rows in, the offline output's columns out; pictures as an upload
or base64: :mod:`.images`),
``POST /v1/embeddings``, ``/v1/chat/completions``, ``/v1/completions`` (OpenAI-compatible),
``GET /v1/results/{id}`` (precomputed, with live fallback), ``GET /healthz``, ``GET /readyz``,
``GET /metrics`` (Prometheus); with ``serve.batches``, the Files and Batches APIs
(:mod:`.batch_routes`). Every error is JSON ``{"error": {"message", "type", "code"}}``
naming the problem; no traceback ever leaves the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pyarrow as pa
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..config import JobConfig
from ..llm.openai_api import CHAT, COMPLETIONS
from . import openai
from .generation import generate
from .images import image_table
from .moderations import moderations
from .server import Server
from .validation import ApiError, JSONResponse, live_inputs, read_body

__all__ = ["ApiError", "Server", "build_app"]

log = logging.getLogger("bulkinfer")


async def _request_table(server: Server, request: Request) -> pa.Table:
    """A ``/v1/predict`` request's rows as the table an offline run reads: pictures (an upload
    or base64) for a picture model, else JSON rows."""
    if server.adapter.picture_column is not None:  # a picture model, or several reading one picture column
        return await image_table(request, server.adapter.picture_column, server.passthrough, server.sv)
    body = await read_body(request, server.sv.max_body_bytes)
    return server.check_rows(body.get("rows") if isinstance(body, dict) else None)


class _Routes:
    """The online routes over one :class:`Server` (``/v1/files`` and ``/v1/batches`` are
    :class:`.batch_routes.BatchRoutes`)."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def predict(self, request: Request) -> Response:
        server = self.server
        if server.model.kind == "generate":
            raise ApiError(404, f"a generation model answers POST {CHAT} and {COMPLETIONS}", "not_found")
        table = await _request_table(server, request)
        request.state.rows = table.num_rows
        server.keys.charge_rows(request, table.num_rows)
        answer = await server.infer(table)
        answered = server.answer_rows(table, answer.columns)
        if request.query_params.get("features") == "true":  # the Feast features read for each row
            for row, used in zip(answered, await asyncio.to_thread(server.feature_values, table), strict=True):
                row["features"] = used
        return JSONResponse({"model": server.name, "answered_by": "live", "rows": answered})

    async def results(self, request: Request) -> Response:
        server, index = self.server, self.server.results
        assert index is not None  # mounted only with serve.results (_unserved)
        key = request.path_params["id"]
        row = await asyncio.to_thread(index.get, key)
        if row is not None:
            return JSONResponse({"id": key, "answered_by": "precomputed", "row": row})
        if request.query_params.get("fallback") != "live":
            cols = ", ".join(server.adapter.input_columns)
            raise ApiError(
                404, f"id {key!r} is not among {index.describe()}; "
                f"add ?fallback=live&<{cols}>=... to compute it", "not_found",
            )  # fmt: skip
        values = live_inputs(
            key, request.query_params, server.adapter.input_columns, server.model.kind, server.cfg.execution.redact
        )
        table = server.check_rows([{**values, index.id_column: index.parse_id(key)}])
        answer = await server.infer(table)
        return JSONResponse({"id": key, "answered_by": "live", "row": server.answer_rows(table, answer.columns)[0]})

    async def embeddings(self, request: Request) -> Response:
        return await openai.embeddings(self.server, request)

    async def chat_completions(self, request: Request) -> Response:
        return await generate(self.server, request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await generate(self.server, request, COMPLETIONS)

    async def moderations(self, request: Request) -> Response:
        return await moderations(self.server, request)

    async def search(self, request: Request) -> Response:
        from .search import search

        return await search(self.server, request)

    async def models(self, _request: Request) -> Response:
        """``GET /v1/models``: the served model under each name a request's ``model`` may give."""
        return JSONResponse({"object": "list", "data": [self._model(n) for n in self.server.model_names]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["id"]
        if name not in self.server.model_names:
            served = ", ".join(self.server.model_names)
            raise ApiError(404, f"model {name!r} is not served here (served: {served})", "invalid_request",
                           param="model", code="model_not_found")  # fmt: skip
        return JSONResponse(self._model(name))

    def _model(self, name: str) -> dict[str, object]:
        return {"id": name, "object": "model", "created": int(self.server.started_at), "owned_by": "bulkinfer"}

    async def healthz(self, _request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, _request: Request) -> Response:
        server = self.server
        if server.batcher is not None:
            return JSONResponse({"status": "ready", "model": server.name})
        if server.setup_error:
            return ApiError(503, f"model set-up failed: {server.setup_error}", "unavailable").response()
        return ApiError(503, "the model is still loading", "unavailable", {"Retry-After": "1"}).response()

    async def metrics(self, _request: Request) -> Response:
        server = self.server
        if server.batcher is not None:
            server.metrics.queue_rows.set(server.batcher.queued_rows)
        if server.batches is not None:
            server.metrics.observe_batches(server.batches, server.share)
        body, content_type = server.metrics.render()
        return Response(body, media_type=content_type)


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _on_http_error(request: Request, exc: Exception) -> Response:
    """No such route, or not with this method: JSON like every other error."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        what, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
    else:
        path = request.url.path
        unserved = getattr(request.app.state, "unserved", {})
        reason = next((r for p, r in unserved.items() if path == p or path.startswith(p.split("{", 1)[0])), None)
        what, code = reason or f"no route {request.method} {path}", "not_found"
    return ApiError(exc.status_code, what, "invalid_request", dict(exc.headers or {}), code=code).response()


async def _on_error(request: Request, exc: Exception) -> Response:
    log.error("unexpected error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
    return ApiError(500, "internal error (see the server log)", "internal_error").response()


Handler = Callable[[Request], Awaitable[Response]]


def _guard(server: Server) -> Callable[[str, Handler], Handler]:
    """Wraps a route: the API key checked first; errors answered as JSON; every request timed
    and counted (``/metrics``, the audit log)."""

    def guarded(endpoint: str, handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            t0 = time.perf_counter()
            try:
                server.keys.authorize(request)
                response = await handler(request)
            except ApiError as exc:
                response = exc.response()
            except Exception as exc:
                response = await _on_error(request, exc)
            elapsed = time.perf_counter() - t0
            server.metrics.observe_request(endpoint, response.status_code, elapsed)
            server.audit.record(request, endpoint, response.status_code, elapsed)
            return response

        return wrapped

    return guarded


def build_app(cfg: JobConfig) -> Starlette:
    """The ASGI app serving ``cfg``'s model (set up in the background when the app starts)."""
    server = Server(cfg)
    r, guarded = _Routes(server), _guard(server)
    optional = [
        Route("/v1/embeddings", guarded("embeddings", r.embeddings), methods=["POST"]),
        Route(CHAT, guarded("chat", r.chat_completions), methods=["POST"]),
        Route(COMPLETIONS, guarded("completions", r.completions), methods=["POST"]),
        Route("/v1/results/{id:path}", guarded("results", r.results), methods=["GET"]),
        Route("/v1/search", guarded("search", r.search), methods=["POST"]),
    ]
    unserved = _unserved(server)  # the routes this model cannot answer: not served, nor announced
    routes = [
        Route("/v1/predict", guarded("predict", r.predict), methods=["POST"]),
        *(route for route in optional if route.path not in unserved),
        Route("/v1/models", guarded("models", r.models), methods=["GET"]),
        Route("/v1/models/{id:path}", guarded("models", r.model), methods=["GET"]),
        Route("/healthz", r.healthz, methods=["GET"]),
        Route("/readyz", r.readyz, methods=["GET"]),
        Route("/metrics", r.metrics, methods=["GET"]),
    ]
    if server.moderation_kinds is not None:  # a [moderation] section: its categories are answered
        routes.append(Route("/v1/moderations", guarded("moderations", r.moderations), methods=["POST"]))
    if server.batches is not None:
        routes += _batch_routes(server, guarded)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        server.start()
        yield
        await asyncio.to_thread(server.close)

    handlers = {ApiError: _on_api_error, HTTPException: _on_http_error, Exception: _on_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.server, app.state.unserved = server, unserved
    return app


def _unserved(server: Server) -> dict[str, str]:
    """The optional routes this server's model cannot answer, each with why (its 404 says so)."""
    from ..adapters.knn import KnnAdapter

    why = {}
    if server.model.kind != "text-embedding":
        why["/v1/embeddings"] = "this model makes no embeddings; use POST /v1/predict"
    if server.model.kind != "generate":
        why[CHAT] = f"this model generates no text; {CHAT} needs a generation model"
        why[COMPLETIONS] = f"this model generates no text; {COMPLETIONS} needs a generation model"
    if server.results is None:
        why["/v1/results/{id:path}"] = "no precomputed results here: start the server with serve.results = OUT/"
    if not isinstance(server.adapter, KnnAdapter):
        why["/v1/search"] = "no index here: start the server with --model items.index (bulkinfer index)"
    return why


def _batch_routes(server: Server, guarded: Callable[[str, Handler], Handler]) -> list[Route]:
    """``/v1/files`` and ``/v1/batches`` (serve.batches)."""
    from .batch_routes import BatchRoutes

    b = BatchRoutes(server)
    return [
        Route("/v1/files", guarded("files", b.create_file), methods=["POST"]),
        Route("/v1/files", guarded("files", b.list_files), methods=["GET"]),
        Route("/v1/files/{id}", guarded("files", b.get_file), methods=["GET"]),
        Route("/v1/files/{id}", guarded("files", b.delete_file), methods=["DELETE"]),
        Route("/v1/files/{id}/content", guarded("files", b.file_content), methods=["GET"]),
        Route("/v1/batches", guarded("batches", b.create_batch), methods=["POST"]),
        Route("/v1/batches", guarded("batches", b.list_batches), methods=["GET"]),
        Route("/v1/batches/{id}", guarded("batches", b.get_batch), methods=["GET"]),
        Route("/v1/batches/{id}/cancel", guarded("batches", b.cancel_batch), methods=["POST"]),
    ]
