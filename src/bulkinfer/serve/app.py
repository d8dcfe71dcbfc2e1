"""The HTTP server over a job's adapter: an ASGI app (Starlette) run by uvicorn.

Routes: ``POST /v1/predict`` (rows in, the offline output's columns out),
``POST /v1/embeddings`` (OpenAI-compatible), ``GET /healthz``, ``GET /readyz``,
``GET /metrics`` (Prometheus). Every error is JSON ``{"error": {"message", "type",
"code"}}`` naming the problem; no traceback ever leaves the server.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..adapters import Adapter, build_adapter, job_setup_context, resolve_model, to_numpy_column
from ..config import JobConfig
from ..errors import BulkinferError, ConfigError
from ..job import resolve_batch_size
from .batcher import Answer, Batcher, Overloaded, measure_call_overhead
from .metrics import ServeMetrics
from .results import ResultIndex

__all__ = ["ApiError", "build_app"]

log = logging.getLogger("bulkinfer")

_NUMERIC_KINDS = ("tabular", "onnx")


class ApiError(Exception):
    """An error answered to the client with ``status`` and a one-line message."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


class JSONResponse(Response):
    """JSON by orjson: numpy arrays (embeddings) are written without a Python float per value."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def _load_keys(path: str | None) -> list[bytes]:
    if path is None:
        return []
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"serve.api_keys_file: cannot read {path} ({exc.strerror or exc})") from exc
    keys = [line.strip().encode() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"serve.api_keys_file: {path} holds no key (one per line)")
    return keys


class _Server:
    """The model, its batcher and the request checks; shared by the routes."""

    def __init__(self, cfg: JobConfig) -> None:
        self.cfg = cfg
        self.sv = cfg.serve
        self.keys = _load_keys(self.sv.api_keys_file)
        self.model = resolve_model(cfg)
        self.adapter: Adapter = build_adapter(cfg, self.model)
        cfg = self.cfg = resolve_batch_size(cfg, self.model.digest, self.adapter)
        self.passthrough = [c for c in cfg.passthrough_columns if c not in self.adapter.input_columns]
        self.metrics = ServeMetrics()
        self.batcher: Batcher | None = None
        self.setup_error: str | None = None
        self.name = cfg.model.name
        self.results = ResultIndex(self.sv.results, cfg.source.id_column) if self.sv.results else None
        if self.results is not None:
            log.info("precomputed results: %d ids from %s", len(self.results), self.results.out_dir)

    def start(self) -> None:
        """Set the model up in the background; /readyz turns 200 when it is loaded."""
        threading.Thread(target=self._setup, name="bulkinfer-setup", daemon=True).start()

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

    # -- request checks -------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        if not self.keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not any(hmac.compare_digest(token.strip().encode(), k) for k in self.keys):
            raise ApiError(
                401, "missing or invalid API key (Authorization: Bearer <key>)", "unauthorized",
                {"WWW-Authenticate": "Bearer"},
            )  # fmt: skip

    async def body(self, request: Request) -> Any:
        limit = self.sv.max_body_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise ApiError(413, f"request body of {length} bytes is over serve.max_body_bytes={limit}", "too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body is over serve.max_body_bytes={limit}", "too_large")
            chunks.append(chunk)
        try:
            return orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise ApiError(422, f"body is not valid JSON at {where}", "invalid_json") from None

    def ready_batcher(self) -> Batcher:
        if self.batcher is None:
            why = f"model set-up failed: {self.setup_error}" if self.setup_error else "the model is still loading"
            raise ApiError(503, why, "unavailable", {"Retry-After": "1"})
        return self.batcher

    def check_rows(self, rows: Any) -> pa.Table:
        """The request's rows as a table of the model's input columns (and the kept ones)."""
        if not isinstance(rows, list) or not rows:
            raise ApiError(422, "rows: expected a non-empty list of objects", "invalid_request")
        if len(rows) > self.sv.max_rows_per_request:
            raise ApiError(
                413, f"rows: {len(rows)} rows is over serve.max_rows_per_request={self.sv.max_rows_per_request}",
                "too_large",
            )  # fmt: skip
        kind = self.model.kind
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ApiError(422, f"rows[{i}]: expected an object, got {type(row).__name__}", "invalid_request")
            for col in self.adapter.input_columns:
                if col not in row:
                    cols = ", ".join(self.adapter.input_columns)
                    raise ApiError(422, f"rows[{i}].{col}: missing (the model reads {cols})", "invalid_request")
                value = row[col]
                if kind == "text-embedding" and not isinstance(value, str):
                    raise ApiError(
                        422, f"rows[{i}].{col}: expected a string, got {_json_type(value)}", "invalid_request"
                    )
                if kind in _NUMERIC_KINDS and (isinstance(value, bool) or not isinstance(value, int | float | None)):
                    raise ApiError(
                        422, f"rows[{i}].{col}: expected a number, got {_json_type(value)}", "invalid_request"
                    )
        columns = list(dict.fromkeys([*self.adapter.input_columns, *self.passthrough]))
        data = {}
        for col in columns:
            if col in self.passthrough and not all(col in r for r in rows):
                continue  # kept columns are echoed when every row has them
            try:
                data[col] = pa.array([r.get(col) for r in rows])
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ApiError(422, f"rows[*].{col}: values of mixed types ({exc})", "invalid_request") from None
        return pa.table(data)

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
        except BulkinferError as exc:
            raise ApiError(422, f"the model refused this request: {exc}", "model_error") from None
        except Exception as exc:
            message = " ".join(str(exc).split())[:300]
            raise ApiError(
                422, f"the model failed on this request: {type(exc).__name__}: {message}", "model_error"
            ) from None

    def answer_rows(self, table: pa.Table, outputs: dict[str, pa.Array]) -> list[dict[str, Any]]:
        """Kept input columns and the model's, as an offline run writes them."""
        kept = [c for c in self.passthrough if c in table.column_names]
        columns = [*(table.column(c) for c in kept), *outputs.values()]
        rows: list[dict[str, Any]] = pa.Table.from_arrays(columns, names=[*kept, *outputs]).to_pylist()
        return rows

    def live_inputs(self, key: str, query: Any) -> dict[str, Any]:
        """The model's inputs for a live answer to ``GET /v1/results/{id}``, from the query string."""
        values: dict[str, Any] = {}
        for col in self.adapter.input_columns:
            if col not in query:
                raise ApiError(
                    422, f"{col}: missing query parameter (needed to compute id {key!r} live)", "invalid_request"
                )
            values[col] = query[col]
            if self.model.kind in _NUMERIC_KINDS:
                try:
                    values[col] = float(query[col])
                except ValueError:
                    raise ApiError(422, f"{col}: expected a number, got {query[col]!r}", "invalid_request") from None
        return values


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def build_app(cfg: JobConfig) -> Starlette:
    """The ASGI app serving ``cfg``'s model (set up in the background when the app starts)."""
    server = _Server(cfg)

    async def predict(request: Request) -> Response:
        server.authorize(request)
        body = await server.body(request)
        rows = body.get("rows") if isinstance(body, dict) else None
        table = server.check_rows(rows)
        answer = await server.infer(table)
        answered = server.answer_rows(table, answer.columns)
        return JSONResponse({"model": server.name, "answered_by": "live", "rows": answered})

    async def results(request: Request) -> Response:
        server.authorize(request)
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
                404, f"id {key!r} is not among the {len(index)} precomputed rows of {index.out_dir}; "
                f"add ?fallback=live&<{cols}>=... to compute it", "not_found",
            )  # fmt: skip
        values = server.live_inputs(key, request.query_params)
        table = server.check_rows([{**values, index.id_column: index.parse_id(key)}])
        answer = await server.infer(table)
        return JSONResponse({"id": key, "answered_by": "live", "row": server.answer_rows(table, answer.columns)[0]})

    async def embeddings(request: Request) -> Response:
        server.authorize(request)
        if server.model.kind != "text-embedding":
            raise ApiError(404, "this model makes no embeddings; use POST /v1/predict", "not_found")
        body = await server.body(request)
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

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        if server.batcher is not None:
            return JSONResponse({"status": "ready", "model": server.name})
        if server.setup_error:
            return _error(503, f"model set-up failed: {server.setup_error}", "unavailable")
        return _error(503, "the model is still loading", "unavailable", {"Retry-After": "1"})

    async def metrics(_request: Request) -> Response:
        if server.batcher is not None:
            server.metrics.queue_rows.set(server.batcher.queued_rows)
        body, content_type = server.metrics.render()
        return Response(body, media_type=content_type)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _error(exc.status, exc.message, exc.kind, exc.headers)

    async def on_error(request: Request, exc: Exception) -> Response:
        log.error("unexpected error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
        return _error(500, "internal error (see the server log)", "internal_error")

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        server.start()
        yield
        if server.batcher is not None:
            server.batcher.close()

    def timed(endpoint: str, handler: Any) -> Any:
        async def wrapped(request: Request) -> Response:
            t0 = time.perf_counter()
            try:
                response: Response = await handler(request)
            except ApiError as exc:
                response = _error(exc.status, exc.message, exc.kind, exc.headers)
            except Exception as exc:
                response = await on_error(request, exc)
            server.metrics.observe_request(endpoint, response.status_code, time.perf_counter() - t0)
            return response

        return wrapped

    routes = [
        Route("/v1/predict", timed("predict", predict), methods=["POST"]),
        Route("/v1/embeddings", timed("embeddings", embeddings), methods=["POST"]),
        Route("/v1/results/{id:path}", timed("results", results), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ApiError: on_api_error, Exception: on_error})
    app.state.server = server
    return app
