"""Requests in, checked: body size limits, JSON, rows of the model's input columns with the
right JSON types. Every refusal is an :class:`ApiError` with a status and one line naming
the field; the app answers it as ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["ApiError", "JSONResponse", "bad_request", "check_rows", "error_type", "live_inputs", "read_body"]

NUMERIC_KINDS = ("tabular", "onnx")


class ApiError(Exception):
    """An error answered to the client with ``status`` and a one-line message."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        headers: dict[str, str] | None = None,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}
        self.param, self.code = param, code

    def response(self) -> JSONResponse:
        """``{"error": {"message", "type", "param", "code"}}`` as OpenAI's ``Error``: ``type`` the
        class of error OpenAI names for the status, ``code`` a string saying which (the route's
        own code, else ``kind``: ``not_found``, ``too_large``...)."""
        return JSONResponse({"error": self.body()}, self.status, headers=self.headers)

    def body(self) -> dict[str, Any]:
        return {"message": self.message, "type": error_type(self.status), "param": self.param,
                "code": self.code or self.kind}  # fmt: skip


def bad_request(exc: Any) -> ApiError:
    """A request refused by the OpenAI-request checks (``llm.openai_api.BadRequest``): a 400
    naming the field, or OpenAI's 404 ``model_not_found`` for a model the job does not run."""
    status = 404 if exc.code == "model_not_found" else 400
    return ApiError(status, str(exc), "invalid_request", param=exc.param, code=exc.code)


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status: a request's fault, a rate limit, the server's."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


class JSONResponse(Response):
    """JSON by orjson: numpy arrays (embeddings) are written without a Python float per value."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


async def read_body(request: Request, limit: int) -> Any:
    """The request's JSON body, refused (413) past ``limit`` bytes before it is all read."""
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
        raise ApiError(400, f"body is not valid JSON at {where}", "invalid_request", code="invalid_json") from None


def check_rows(
    rows: Any, input_columns: Sequence[str], kind: str, passthrough: Sequence[str], max_rows: int
) -> pa.Table:
    """The request's rows as a table of the model's input columns (and the kept ones)."""
    if not isinstance(rows, list) or not rows:
        raise ApiError(422, "rows: expected a non-empty list of objects", "invalid_request")
    if len(rows) > max_rows:
        raise ApiError(
            413, f"rows: {len(rows)} rows is over serve.max_rows_per_request={max_rows}", "too_large"
        )  # fmt: skip
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ApiError(422, f"rows[{i}]: expected an object, got {type(row).__name__}", "invalid_request")
        for col in input_columns:
            if col not in row:
                cols = ", ".join(input_columns)
                raise ApiError(422, f"rows[{i}].{col}: missing (the model reads {cols})", "invalid_request")
            value = row[col]
            if kind == "text-embedding" and not isinstance(value, str):
                raise ApiError(422, f"rows[{i}].{col}: expected a string, got {json_type(value)}", "invalid_request")
            if kind in NUMERIC_KINDS and (isinstance(value, bool) or not isinstance(value, int | float | None)):
                raise ApiError(422, f"rows[{i}].{col}: expected a number, got {json_type(value)}", "invalid_request")
    columns = list(dict.fromkeys([*input_columns, *passthrough]))
    data = {}
    for col in columns:
        if col in passthrough and not all(col in r for r in rows):
            continue  # kept columns are echoed when every row has them
        try:
            data[col] = pa.array([r.get(col) for r in rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ApiError(422, f"rows[*].{col}: values of mixed types ({exc})", "invalid_request") from None
    return pa.table(data)


def live_inputs(
    key: str, query: Mapping[str, str], input_columns: Sequence[str], kind: str, redact: bool = False
) -> dict[str, Any]:
    """The model's inputs for a live answer to ``GET /v1/results/{id}``, from the query string
    (``redact``: a value that is not a number is not quoted back)."""
    values: dict[str, Any] = {}
    for col in input_columns:
        if col not in query:
            raise ApiError(
                422, f"{col}: missing query parameter (needed to compute id {key!r} live)", "invalid_request"
            )
        values[col] = query[col]
        if kind in NUMERIC_KINDS:
            try:
                values[col] = float(query[col])
            except ValueError:
                got = "a value that is not one" if redact else repr(query[col])
                raise ApiError(422, f"{col}: expected a number, got {got}", "invalid_request") from None
    return values


def json_type(value: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
