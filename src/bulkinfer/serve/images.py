"""``POST /v1/predict`` to a picture model: the pictures as a multipart upload (each file one
row, its ``id`` the file's name unless an ``id`` field is given per file, in order) or as JSON
rows whose picture column is base64. Each picture is held to ``serve.max_image_bytes`` (413
naming it) and its pixels to ``source.max_image_pixels`` (400, from the decode); the rows then
go through the same adapter, batcher and columns as an offline run of the same bytes."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import pyarrow as pa
from starlette.datastructures import UploadFile
from starlette.requests import Request

from .validation import ApiError, read_body

__all__ = ["image_table"]


def _sized(data: bytes, where: str, limit: int) -> bytes:
    if len(data) > limit:
        raise ApiError(
            413, f"{where}: the picture is {len(data)} bytes, over serve.max_image_bytes={limit}", "too_large"
        )
    return data


async def _uploads(request: Request, column: str, limit: int, max_rows: int) -> list[dict[str, Any]]:
    form = await request.form(max_files=max_rows + 1, max_part_size=limit + 1)
    files = [(key, v) for key, v in form.multi_items() if isinstance(v, UploadFile)]
    ids = [str(v) for key, v in form.multi_items() if key == "id" and not isinstance(v, UploadFile)]
    if not files:
        raise ApiError(
            422, f"the upload holds no file; send each picture as a file field ({column})", "invalid_request"
        )
    if ids and len(ids) != len(files):
        raise ApiError(
            422, f"{len(ids)} id fields for {len(files)} files; give one per file or none", "invalid_request"
        )
    rows = []
    for i, (_key, upload) in enumerate(files):
        data = _sized(await upload.read(), f"files[{i}] ({upload.filename})", limit)
        rows.append({column: data, "id": ids[i] if ids else (upload.filename or str(i))})
    return rows


def _decoded(rows: Any, column: str, limit: int) -> list[dict[str, Any]]:
    if not isinstance(rows, list) or not rows:
        raise ApiError(422, "rows: expected a non-empty list of objects", "invalid_request")
    out = []
    for i, row in enumerate(rows):
        value = row.get(column) if isinstance(row, dict) else None
        if not isinstance(value, str):
            raise ApiError(
                422, f"rows[{i}].{column}: expected the picture's bytes as a base64 string", "invalid_request"
            )
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, f"rows[{i}].{column}: not valid base64", "invalid_request") from None
        out.append({**row, column: _sized(data, f"rows[{i}].{column}", limit)})
    return out


async def image_table(request: Request, column: str, passthrough: list[str], sv: Any) -> pa.Table:
    """The request's pictures as the table an offline run reads (``column`` as bytes)."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > sv.max_body_bytes:
        raise ApiError(
            413, f"request body of {length} bytes is over serve.max_body_bytes={sv.max_body_bytes}", "too_large"
        )
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        rows = await _uploads(request, column, sv.max_image_bytes, sv.max_rows_per_request)
    else:
        body = await read_body(request, sv.max_body_bytes)
        rows = _decoded(body.get("rows") if isinstance(body, dict) else None, column, sv.max_image_bytes)
    if len(rows) > sv.max_rows_per_request:
        raise ApiError(
            413, f"{len(rows)} pictures is over serve.max_rows_per_request={sv.max_rows_per_request}", "too_large"
        )
    data = {column: pa.array([r[column] for r in rows], pa.binary())}
    for col in passthrough:
        if all(col in r for r in rows):
            data[col] = pa.array([r[col] for r in rows])
    return pa.table(data)
