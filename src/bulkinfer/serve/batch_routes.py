"""The batch service's routes, as OpenAI's Files and Batches APIs have them (the official
``openai`` client's ``files.*`` and ``batches.*`` work unchanged):

``POST /v1/files`` (multipart: ``file``, ``purpose=batch``, optional ``expires_after``),
``GET /v1/files``, ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``,
``DELETE /v1/files/{id}``; ``POST /v1/batches``, ``GET /v1/batches`` (newest first,
``after``/``limit``), ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

A key sees only what it created (another key's id is a 404); every request field is
honoured or refused with a 400 naming it (``error.param``).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response

from .batch_jobs import ENDPOINTS
from .files import page
from .validation import ApiError, JSONResponse, read_body

if TYPE_CHECKING:
    from .server import Server

__all__ = ["BatchRoutes"]

BAD = "invalid_request"
FILE_FIELDS = {"file", "purpose", "expires_after[anchor]", "expires_after[seconds]"}
BATCH_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}
EXPIRY_S = (3600, 30 * 24 * 3600)  # what OpenAI's expires_after allows


def _owner(request: Request) -> str | None:
    return getattr(request.state, "key_id", None)


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, BAD, param=param, code=code)


def _expiry_seconds(value: Any, param: str) -> int:
    """``expires_after``'s seconds (anchor ``created_at``), refused outside OpenAI's range."""
    if not isinstance(value, dict) or set(value) - {"anchor", "seconds"}:
        raise _bad(f"{param}: an object {{anchor: 'created_at', seconds: N}}", param)
    if value.get("anchor") != "created_at":
        raise _bad(f"{param}.anchor: only 'created_at' is supported", f"{param}.anchor")
    seconds = value.get("seconds")
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not EXPIRY_S[0] <= seconds <= EXPIRY_S[1]:
        raise _bad(f"{param}.seconds: an integer from {EXPIRY_S[0]} to {EXPIRY_S[1]}", f"{param}.seconds")
    return seconds


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise _bad(f"limit: an integer from 1 to {most}", "limit")
    return int(raw)


def _check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    ok = isinstance(metadata, dict) and len(metadata) <= 16
    ok = ok and all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                    for k, v in metadata.items())  # fmt: skip
    if not ok:
        raise _bad("metadata: at most 16 string pairs, keys up to 64 characters, values up to 512", "metadata")
    return dict(metadata)


class BatchRoutes:
    """Handlers over the server's file store and batch queue."""

    def __init__(self, server: Server) -> None:
        assert server.files is not None and server.batches is not None
        self.server, self.files, self.batches = server, server.files, server.batches
        self.sv = server.sv
        self.endpoints = ENDPOINTS.get(server.model.kind, ())

    # -- files -------------------------------------------------------------
    async def create_file(self, request: Request) -> Response:
        limit = self.sv.max_file_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit + (1 << 16):
            raise ApiError(413, f"file: the upload is over {limit} bytes (serve.max_file_bytes); split it",
                           BAD, param="file")  # fmt: skip
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise _bad("POST /v1/files takes multipart/form-data with file and purpose", None)
        async with request.form(max_files=1, max_fields=8) as form:
            unknown = sorted(set(form) - FILE_FIELDS)
            if unknown:
                raise _bad(f"{unknown[0]}: not a field of a file upload ({', '.join(sorted(FILE_FIELDS))})", unknown[0])
            purpose = form.get("purpose")
            if purpose != "batch":
                raise _bad(f"purpose: {purpose!r}; this server keeps files for the Batch API: purpose 'batch'",
                           "purpose")  # fmt: skip
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise _bad("file: no file in the upload", "file")
            expires_at = None
            if "expires_after[anchor]" in form or "expires_after[seconds]" in form:
                expiry = {"anchor": form.get("expires_after[anchor]"), "seconds": form.get("expires_after[seconds]")}
                expires_at = int(time.time()) + _expiry_seconds(expiry, "expires_after")
            owner = _owner(request)
            room = self._room(request, owner)
            try:
                stored = await asyncio.to_thread(
                    self.files.upload, upload.file, filename=upload.filename or "upload.jsonl", purpose=purpose,
                    owner=owner, max_bytes=min(limit, room), expires_at=expires_at,
                )  # fmt: skip
            except ApiError as exc:
                if exc.status == 413 and room < limit:
                    raise self._full(owner) from None
                raise
        self.server.audit.event(owner, "file.created", stored.id, bytes=stored.bytes)
        return JSONResponse(stored.public())

    def _room(self, request: Request, owner: str | None) -> int:
        """The bytes the request's key may still upload (its ``file_bytes`` less what it holds)."""
        key = getattr(request.state, "api_key", None)
        quota = getattr(key, "file_bytes", None)
        if quota is None:
            return self.sv.max_file_bytes
        room = int(quota) - self.files.held_bytes(owner)
        if room <= 0:
            raise self._full(owner)
        return room

    def _full(self, owner: str | None) -> ApiError:
        return _bad(f"file: key {owner} would hold more than its file_bytes limit; delete files first", "file",
                    "storage_limit_exceeded")  # fmt: skip

    async def list_files(self, request: Request) -> Response:
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise _bad("order: 'asc' or 'desc'", "order")
        unknown = sorted(set(request.query_params) - {"after", "limit", "order", "purpose"})
        if unknown:
            raise _bad(f"{unknown[0]}: not a parameter of GET /v1/files", unknown[0])
        files = self.files.owned_by(_owner(request), request.query_params.get("purpose"), ascending=order == "asc")
        after = request.query_params.get("after")
        return JSONResponse(page([f.public() for f in files], after, _limit(request, 10_000, 10_000)))

    async def get_file(self, request: Request) -> Response:
        return JSONResponse(self.files.get(request.path_params["id"], _owner(request)).public())

    async def file_content(self, request: Request) -> Response:
        f = self.files.get(request.path_params["id"], _owner(request))
        return FileResponse(self.files.path(f), media_type="application/jsonl", filename=f.filename)

    async def delete_file(self, request: Request) -> Response:
        fid, owner = request.path_params["id"], _owner(request)
        self.files.delete(fid, owner)
        self.server.audit.event(owner, "file.deleted", fid)
        return JSONResponse({"id": fid, "object": "file", "deleted": True})

    # -- batches -------------------------------------------------------------
    async def create_batch(self, request: Request) -> Response:
        body = await read_body(request, self.sv.max_body_bytes)
        if not isinstance(body, dict):
            raise _bad("the body is a JSON object: input_file_id, endpoint, completion_window", None)
        unknown = sorted(set(body) - BATCH_FIELDS)
        if unknown:
            raise _bad(f"{unknown[0]}: not a field of a batch ({', '.join(sorted(BATCH_FIELDS))})", unknown[0])
        owner = _owner(request)
        fid = body.get("input_file_id")
        if not isinstance(fid, str):
            raise _bad("input_file_id: the id of a file uploaded with purpose 'batch'", "input_file_id")
        try:
            source = self.files.get(fid, owner)
        except ApiError:
            raise _bad(f"input_file_id: no file {fid!r}", "input_file_id", "invalid_file") from None
        if source.purpose != "batch":
            raise _bad(f"input_file_id: {fid} has purpose {source.purpose!r}, not 'batch'", "input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in self.endpoints:
            raise _bad(
                f"endpoint: {endpoint!r}; this server's {self.server.model.kind} model answers "
                f"{' and '.join(self.endpoints)}", "endpoint", "unsupported_endpoint",
            )  # fmt: skip
        window = body.get("completion_window")
        if window != "24h":
            raise _bad(f"completion_window: {window!r}; only '24h' is supported", "completion_window")
        metadata = _check_metadata(body.get("metadata"))
        keep = body.get("output_expires_after")
        keep_s = None if keep is None else _expiry_seconds(keep, "output_expires_after")
        record = await asyncio.to_thread(self.batches.create, owner, source, endpoint, window, metadata, keep_s)
        return JSONResponse(record)

    async def list_batches(self, request: Request) -> Response:
        unknown = sorted(set(request.query_params) - {"after", "limit"})
        if unknown:
            raise _bad(f"{unknown[0]}: not a parameter of GET /v1/batches", unknown[0])
        items = self.batches.owned_by(_owner(request))
        return JSONResponse(page(items, request.query_params.get("after"), _limit(request, 20, 100)))

    async def get_batch(self, request: Request) -> Response:
        return JSONResponse(self.batches.get(request.path_params["id"], _owner(request)))

    async def cancel_batch(self, request: Request) -> Response:
        return JSONResponse(self.batches.cancel(request.path_params["id"], _owner(request)))
