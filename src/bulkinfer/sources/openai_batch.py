"""OpenAI Batch API input files (``source.format = "openai-batch"``, detected from a JSONL
file whose first line is a request): one request per line,
``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``.

Every line that names a ``custom_id`` becomes a row (``custom_id``, ``method``, ``url``,
``body`` as JSON text, ``line_error``); the model's adapter checks the request and answers
it or records it as that request's error. A line that is not a JSON object or has no
string ``custom_id`` is an error row of the file. A ``custom_id`` an earlier line of the
file already used is found at planning (``Shard.repeats``) and its line is an error of its
own (``line_error``): each ``custom_id`` is answered exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..core.errors import SourceError
from ..core.storage import open_binary, read_range
from .encoding import codec_of, decoded, open_text_head
from .jsonl import json_lines, plan_lines
from .shard import MAX_RECORD_BYTES, BadRow, InputFile, Shard, Span, numbered

__all__ = ["COLUMNS", "OpenAIBatchFormat", "looks_like_batch"]

COLUMNS = ("custom_id", "method", "url", "body", "line_error")


LINE_FIELDS = ("custom_id", "method", "url", "body")
"""The fields of a batch request line (OpenAI's ``BatchRequestInput``); any other is refused, as OpenAI does."""


def _line_error(obj: Mapping[str, Any], cid: str, repeated: bool) -> str | None:
    """Why a line with a custom_id is refused before its request is read: a repeated custom_id,
    a field a batch line does not have."""
    if repeated:
        return f"custom_id {cid!r} was already used by an earlier line; custom_id must be unique"
    unknown = [k for k in obj if k not in LINE_FIELDS]
    if unknown:
        return f"{unknown[0]}: not a field of a batch request line ({', '.join(LINE_FIELDS)})"
    return None


def _custom_id(line: bytes) -> str | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    return cid if isinstance(cid, str) else None


def looks_like_batch(uri: str, lines: int = 20) -> bool:
    """Whether the file is one of OpenAI batch requests: its first line that is a JSON object
    (within the first ``lines`` non-empty ones: a broken line does not hide what the file is)
    has a ``custom_id`` and a ``url``. A byte-order mark says the file's encoding."""
    try:
        with open_binary(uri) as fh:
            codec = codec_of(fh.read(4), "auto")
        with open_text_head(uri, codec) as fh:
            seen = 0
            for line in fh:
                if not line.strip():
                    continue
                seen += 1
                try:
                    obj = json.loads(line)
                except ValueError:
                    if seen >= lines:
                        return False
                    continue
                return isinstance(obj, dict) and {"custom_id", "url"} <= set(obj)
    except (OSError, SourceError):
        return False
    return False


class OpenAIBatchFormat:
    name = "openai-batch"
    extensions: tuple[str, ...] = ()  # .jsonl is JSONL unless declared or detected

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        seen: set[str] = set()
        repeats: list[int] = []

        def note(row: int, line: bytes) -> None:
            cid = _custom_id(line)
            if cid is not None:
                if cid in seen:
                    repeats.append(row)
                seen.add(cid)

        spans = plan_lines(f, shard_rows, max_record, note)
        return [s._replace(repeats=tuple(r for r in repeats if s.start <= r < s.stop)) if repeats else s
                for s in spans]  # fmt: skip

    def head_schema(self, f: InputFile) -> pa.Schema:
        return pa.schema([(c, pa.string()) for c in COLUMNS])

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        repeats = set(shard.repeats)
        good: list[dict[str, Any]] = []
        rows: list[int] = []
        data = decoded(read_range(shard), shard.encoding, shard.uri, shard.offset or 0)
        for row, obj in json_lines(shard, data, bad, "; each line is one request object"):
            cid = obj.get("custom_id") if isinstance(obj, dict) else None
            if not isinstance(cid, str) or not cid:
                what = "no string custom_id" if isinstance(obj, dict) else f"a {type(obj).__name__}, not an object"
                bad(row, f"the request has {what}; every line needs a unique custom_id")
                continue
            body = obj.get("body")
            good.append(
                {
                    "custom_id": cid,
                    "method": obj.get("method") if isinstance(obj.get("method"), str) else None,
                    "url": obj.get("url") if isinstance(obj.get("url"), str) else None,
                    "body": json.dumps(body, ensure_ascii=False) if body is not None else None,
                    "line_error": _line_error(obj, cid, row in repeats),
                }
            )
            rows.append(row)
        table = pa.table({c: pa.array([g[c] for g in good], pa.string()) for c in columns})
        for b in table.to_batches(max_chunksize=batch_rows):
            yield numbered(b, pa.array(rows[: b.num_rows], pa.int64()).to_numpy())
            rows = rows[b.num_rows :]
