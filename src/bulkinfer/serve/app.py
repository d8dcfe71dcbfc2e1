"""The HTTP server over a job's adapter: an ASGI app (Starlette) run by uvicorn. This
module holds the routing, the lifespan and the model behind the routes; request checks
are in :mod:`.validation`, API keys in :mod:`.auth`, the OpenAI route in :mod:`.openai`.

Routes: ``POST /v1/predict`` (rows in, the offline output's columns out),
``POST /v1/embeddings``, ``/v1/chat/completions``, ``/v1/completions`` (OpenAI-compatible),
``GET /v1/results/{id}`` (precomputed, with live fallback), ``GET /healthz``, ``GET /readyz``,
``GET /metrics`` (Prometheus). Every error is JSON ``{"error": {"message", "type", "code"}}``
naming the problem; no traceback ever leaves the server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..adapters import RowsRejected, job_setup_context
from ..config import JobConfig
from ..core.errors import BulkinferError
from ..core.records import withheld
from ..llm.openai_api import CHAT, COMPLETIONS
from ..precision.settle import settle
from . import openai
from .audit import AuditLog
from .auth import KeyRing
from .batcher import Answer, Batcher, Overloaded, measure_call_overhead
from .generation import generate
from .metrics import ServeMetrics
from .results import ResultIndex

if TYPE_CHECKING:
    from .redis_results import RedisResults
from .validation import ApiError, JSONResponse, check_rows, error_response, live_inputs, read_body

__all__ = ["ApiError", "Server", "build_app"]

log = logging.getLogger("bulkinfer")


class Server:
    """The model, its batcher and what the routes share."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.sv = cfg.serve
        self.keys = KeyRing(self.sv.api_keys_file)
        self.audit = AuditLog(self.sv.audit_log, self.sv.audit_max_bytes)
        settled = settle(cfg, online=True)
        cfg = self.cfg = settled.cfg
        self.model, self.adapter = settled.model, settled.adapter
        self.passthrough = [c for c in cfg.passthrough_columns if c not in self.adapter.input_columns]
        self.metrics = ServeMetrics()
        self.batcher: Batcher | None = None
        self.setup_error: str | None = None
        self.name = cfg.model.name
        self.results = _results(self.sv.results, cfg) if self.sv.results else None
        if self.results is not None:
            log.info("precomputed results: %s", self.results.describe())

    def start(self) -> None:
        """Set the model up in the background; /readyz turns 200 when it is loaded."""
        threading.Thread(target=self._setup, name="bulkinfer-setup", daemon=True).start()
        if self.sv.reload_s > 0:
            threading.Thread(target=self._watch, name="bulkinfer-reload", daemon=True).start()

    def _watch(self) -> None:
        """Swap in a newer index or finished run: built aside, then one assignment, so requests in
        flight finish on the old one and none is dropped."""
        while True:
            time.sleep(self.sv.reload_s)
            try:
                reload = getattr(self.adapter, "reload", None)
                if self.batcher is not None and reload is not None and reload():
                    log.info("swapped in the new index %s", self.name)
                newer = self.results.newer() if isinstance(self.results, ResultIndex) else None
                if newer is not None:
                    self.results = newer
                    log.info("swapped in the newer results: %s", newer.describe())
            except BulkinferError as exc:  # keep answering from what is loaded
                log.error("could not swap in the new version: %s", exc)

    def _setup(self) -> None:
        rt = self.cfg.runtime
        try:
            self.adapter.setup(job_setup_context(self.cfg, online=True))
            overhead = None
            if self.model.kind == "text-embedding":
                sample = pa.table({self.adapter.input_columns[0]: ["a short text of some words"] * 16})
                overhead = measure_call_overhead(self.adapter, sample)
                log.info("one model call costs as much as %.0f tokens (merged requests are cut by it)", overhead)
            self.batcher = Batcher(
                self.adapter,
                max_rows=self.sv.max_batch_size,
                batch_size=rt.rows_per_call,
                call_overhead=overhead,
                max_wait_s=self.sv.max_wait_ms / 1000.0,
                max_queue_rows=self.sv.max_queue_rows,
                on_batch=self.metrics.observe_batch,
            )
            log.info("model loaded: %s", self.name)
        except BulkinferError as exc:
            self.setup_error = str(exc)
            log.error("model set-up failed: %s", exc)

    def ready_batcher(self) -> Batcher:
        if self.batcher is None:
            why = f"model set-up failed: {self.setup_error}" if self.setup_error else "the model is still loading"
            raise ApiError(503, why, "unavailable", {"Retry-After": "1"})
        return self.batcher

    def check_rows(self, rows: Any) -> pa.Table:
        return check_rows(
            rows, self.adapter.input_columns, self.model.kind, self.passthrough, self.sv.max_rows_per_request
        )

    async def infer(self, table: pa.Table) -> Answer:
        batcher = self.ready_batcher()
        try:
            future = batcher.submit(table)
        except Overloaded as exc:
            self.metrics.rejected.inc()
            raise ApiError(503, f"server busy: {exc}; retry shortly", "overloaded", {"Retry-After": "1"}) from None
        self.metrics.queue_rows.set(batcher.queued_rows)
        try:
            return await asyncio.wrap_future(future)
        except RowsRejected as exc:  # the request's own fault (its prompt is over the context...)
            (error,) = exc.errors.values()
            raise ApiError(400, str(error), "invalid_request") from None
        except BulkinferError as exc:
            refused = withheld(str(exc), type(exc).__name__)
            raise ApiError(422, f"the model refused this request: {refused}", "model_error") from None
        except Exception as exc:
            message = withheld(" ".join(str(exc).split())[:300], type(exc).__name__)
            raise ApiError(
                422, f"the model failed on this request: {type(exc).__name__}: {message}", "model_error"
            ) from None

    def answer_rows(self, table: pa.Table, outputs: dict[str, pa.Array]) -> list[dict[str, Any]]:
        """Kept input columns and the model's, as an offline run writes them."""
        kept = [c for c in self.passthrough if c in table.column_names]
        columns = [*(table.column(c) for c in kept), *outputs.values()]
        rows: list[dict[str, Any]] = pa.Table.from_arrays(columns, names=[*kept, *outputs]).to_pylist()
        return rows


def _results(where: str, cfg: JobConfig) -> ResultIndex | RedisResults:
    """A finished run's folder, or the current snapshot of a job's Redis export."""
    if where.startswith(("redis://", "rediss://", "unix://")):
        from .redis_results import RedisResults

        return RedisResults(where, cfg)
    return ResultIndex(where, cfg.source.id_column)


def build_app(cfg: JobConfig) -> Starlette:
    """The ASGI app serving ``cfg``'s model (set up in the background when the app starts)."""
    server = Server(cfg)

    async def predict(request: Request) -> Response:
        if server.model.kind == "generate":
            raise ApiError(404, f"a generation model answers POST {CHAT} and {COMPLETIONS}", "not_found")
        body = await read_body(request, server.sv.max_body_bytes)
        rows = body.get("rows") if isinstance(body, dict) else None
        table = server.check_rows(rows)
        request.state.rows = table.num_rows
        server.keys.charge_rows(request, table.num_rows)
        answer = await server.infer(table)
        answered = server.answer_rows(table, answer.columns)
        return JSONResponse({"model": server.name, "answered_by": "live", "rows": answered})

    async def results(request: Request) -> Response:
        index = server.results
        if index is None:
            raise ApiError(404, "no precomputed results here: start the server with serve.results = OUT/", "not_found")
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
        values = live_inputs(key, request.query_params, server.adapter.input_columns, server.model.kind)
        table = server.check_rows([{**values, index.id_column: index.parse_id(key)}])
        answer = await server.infer(table)
        return JSONResponse({"id": key, "answered_by": "live", "row": server.answer_rows(table, answer.columns)[0]})

    async def embeddings(request: Request) -> Response:
        return await openai.embeddings(server, request)

    async def chat_completions(request: Request) -> Response:
        return await generate(server, request, CHAT)

    async def completions(request: Request) -> Response:
        return await generate(server, request, COMPLETIONS)

    async def search_route(request: Request) -> Response:
        from .search import search

        return await search(server, request)

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        if server.batcher is not None:
            return JSONResponse({"status": "ready", "model": server.name})
        if server.setup_error:
            return error_response(503, f"model set-up failed: {server.setup_error}", "unavailable")
        return error_response(503, "the model is still loading", "unavailable", {"Retry-After": "1"})

    async def metrics(_request: Request) -> Response:
        if server.batcher is not None:
            server.metrics.queue_rows.set(server.batcher.queued_rows)
        body, content_type = server.metrics.render()
        return Response(body, media_type=content_type)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.message, exc.kind, exc.headers)

    async def on_error(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
        return error_response(500, "internal error (see the server log)", "internal_error")

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        server.start()
        yield
        if server.batcher is not None:
            server.batcher.close()

    def guarded(endpoint: str, handler: Any) -> Any:
        """The API key checked first; errors answered as JSON; every request timed and counted."""

        async def wrapped(request: Request) -> Response:
            t0 = time.perf_counter()
            try:
                server.keys.authorize(request)
                response: Response = await handler(request)
            except ApiError as exc:
                response = error_response(exc.status, exc.message, exc.kind, exc.headers)
            except Exception as exc:
                response = await on_error(request, exc)
            elapsed = time.perf_counter() - t0
            server.metrics.observe_request(endpoint, response.status_code, elapsed)
            server.audit.record(request, endpoint, response.status_code, elapsed)
            return response

        return wrapped

    routes = [
        Route("/v1/predict", guarded("predict", predict), methods=["POST"]),
        Route("/v1/embeddings", guarded("embeddings", embeddings), methods=["POST"]),
        Route(CHAT, guarded("chat", chat_completions), methods=["POST"]),
        Route(COMPLETIONS, guarded("completions", completions), methods=["POST"]),
        Route("/v1/results/{id:path}", guarded("results", results), methods=["GET"]),
        Route("/v1/search", guarded("search", search_route), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ApiError: on_api_error, Exception: on_error})
    app.state.server = server
    return app
