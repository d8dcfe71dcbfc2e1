"""OpenAI Batch API output files (``sink.format = "openai-batch"``).

Each part holds the answered requests as the Batch API's output lines,
``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}``,
the body exactly what the synchronous API returns. When the job completes, two files are
assembled from the committed parts and error records, as OpenAI hands them out:
``_batch_output.jsonl`` (every answer) and ``_batch_errors.jsonl`` (every request that
failed: a 400 response naming the field for a request bulkinfer will not run, a 500 for a
model failure, and a line with ``error`` for a line that is not a request at all).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from ..core.errors import SourceError
from ..core.records import ErrorRecord, decode_records
from .openai_api import request_id

__all__ = [
    "BATCH_ERRORS",
    "BATCH_OUTPUT",
    "batch_inputs",
    "error_line",
    "output_lines",
    "read_output_lines",
    "write_batch_files",
]

BATCH_OUTPUT, BATCH_ERRORS = "_batch_output.jsonl", "_batch_errors.jsonl"


def output_lines(table: pa.Table) -> bytes:
    """The Batch output lines of an adapter's ``custom_id`` and ``response`` (body JSON) columns."""
    lines = []
    for cid, body in zip(table.column("custom_id").to_pylist(), table.column("response").to_pylist(), strict=True):
        head = json.dumps({"id": request_id("batch_req", cid), "custom_id": cid}, ensure_ascii=False)[:-1]
        response = f'{{"status_code":200,"request_id":{json.dumps(request_id("req", cid))},"body":{body}}}'
        lines.append(f'{head}, "response": {response}, "error": null}}\n')
    return "".join(lines).encode()


def read_output_lines(data: bytes) -> pa.Table:
    """A part's lines back as the columns the adapter wrote (``usage`` gives the token counts)."""
    rows = [json.loads(line) for line in data.splitlines() if line.strip()]
    bodies = [r["response"]["body"] for r in rows]
    usage = [b.get("usage") or {} for b in bodies]
    return pa.table(
        {
            "custom_id": pa.array([r["custom_id"] for r in rows], pa.string()),
            "response": pa.array(
                [json.dumps(b, ensure_ascii=False, separators=(",", ":")) for b in bodies], pa.string()
            ),
            "prompt_tokens": pa.array([u.get("prompt_tokens") for u in usage], pa.int64()),
            "completion_tokens": pa.array([u.get("completion_tokens", 0) for u in usage], pa.int64()),
        }
    )


def error_line(record: ErrorRecord) -> dict[str, Any]:
    """The Batch error-file line of one failed row."""
    cid = record.id
    rid = request_id("batch_req", f"{cid}\0{record.input}:{record.row}")  # a line's own, even for a repeated custom_id
    if cid is None:  # not a request: no custom_id to answer
        line = None if record.row is None else record.row + 1
        error = {"code": "invalid_request_line", "message": record.message, "line": line, "param": None}
        return {"id": rid, "custom_id": None, "response": None, "error": error}
    missing = record.error_type == "ModelNotFound"  # as online: a 404 model_not_found
    bad = missing or record.error_type == "BadRequest"
    status, kind = (404 if missing else 400, "invalid_request_error") if bad else (500, "server_error")
    code = "model_not_found" if missing else None
    body = {"error": {"message": record.message, "type": kind, "param": "model" if missing else None, "code": code}}
    response = {"status_code": status, "request_id": request_id("req", cid), "body": body}
    return {"id": rid, "custom_id": cid, "response": response, "error": None}


def write_batch_files(
    ledger: Any, parts: Iterable[str], error_files: Iterable[str], input_errors: Iterable[ErrorRecord]
) -> None:
    """``_batch_output.jsonl`` and ``_batch_errors.jsonl`` from the committed parts and error files."""
    output = b"".join(ledger.read_part(name) for name in parts)
    records = list(input_errors)
    for name in error_files:
        records += decode_records(ledger.read_error_file(name))
    errors = "".join(json.dumps(error_line(r), ensure_ascii=False) + "\n" for r in records)
    ledger.write_file(BATCH_OUTPUT, output)
    ledger.write_file(BATCH_ERRORS, errors.encode())


def batch_inputs(patterns: list[str]) -> bool:
    """Whether every input is a ``.jsonl`` file of OpenAI batch requests (its first line is one)."""
    from ..sources.listing import expand_inputs
    from ..sources.openai_batch import looks_like_batch

    try:
        uris = sorted({u for p in patterns for u in expand_inputs(p)})
    except SourceError:  # planning says it, with the job's other checks
        return False
    return bool(uris) and all(u.lower().endswith((".jsonl", ".ndjson")) for u in uris) and looks_like_batch(uris[0])
