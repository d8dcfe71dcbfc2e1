"""The OpenAI-compatible generation routes: ``POST /v1/chat/completions`` and
``POST /v1/completions``, whole or streamed (``stream: true``: server-sent events, one chunk
per step of the decoding loop). Each request becomes one row of the generation adapter's
request mode, the same rows an OpenAI batch file makes, so concurrent requests share
model calls through the batcher and a request is answered online as it would be offline."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..llm.openai_api import CHAT, BadRequest, generation_request, request_id
from .validation import ApiError, bad_request, read_body

if TYPE_CHECKING:
    from .server import Server

__all__ = ["generate"]


async def generate(server: Server, request: Request, url: str) -> Response:
    # mounted only for a generation model (app._unserved)
    body = await read_body(request, server.sv.max_body_bytes)
    try:
        req = generation_request(url, body, server.adapter.names)  # type: ignore[attr-defined]
    except BadRequest as exc:
        raise bad_request(exc) from None
    cid = uuid.uuid4().hex
    asked = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    row = {"custom_id": cid, "method": "POST", "url": url, "body": json.dumps(asked), "line_error": None}
    table = pa.Table.from_pylist([row], schema=pa.schema([(k, pa.string()) for k in row]))
    request.state.rows = 1
    server.keys.charge_rows(request, 1)
    if not req.stream:
        answer = await server.infer(table)
        return Response(answer.columns["response"][0].as_py(), media_type="application/json")
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return StreamingResponse(_events(server, table, cid, url, req.stop, usage), media_type="text/event-stream")


async def _events(
    server: Server, table: pa.Table, cid: str, url: str, stop: tuple[str, ...], usage: bool
) -> AsyncIterator[str]:
    """The SSE chunks of one request: text deltas as tokens come, the finish reason, [DONE]."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()
    tokenizer = server.adapter.tokenizer  # type: ignore[attr-defined]
    hold = max((len(s) for s in stop), default=1) - 1  # text that may yet turn out to start a stop string

    def listener(generated: Any, done: bool) -> None:
        if done:
            text = generated.text
        else:
            text = tokenizer.decode(generated.tokens, skip_special_tokens=True).rstrip("\ufffd")
            text = text[: max(0, len(text) - hold)]
        loop.call_soon_threadsafe(queue.put_nowait, (text, done))

    streams: dict[str, Any] = server.adapter.streams  # type: ignore[attr-defined]
    streams[cid] = listener
    chunk_id = request_id("chatcmpl" if url == CHAT else "cmpl", cid)
    task = asyncio.ensure_future(server.infer(table))
    sent = ""
    try:
        if url == CHAT:
            yield _sse(_chunk(url, chunk_id, server, {"role": "assistant", "content": ""}, None))
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                if task.exception() is not None or queue.empty():
                    break
                continue
            text, done = getter.result()
            if text.startswith(sent) and len(text) > len(sent):
                yield _sse(_chunk(url, chunk_id, server, _delta(url, text[len(sent) :]), None))
                sent = text
            if done:
                break
        try:
            answer = await task
        except ApiError as exc:
            yield _sse({"error": exc.body()})
            yield "data: [DONE]\n\n"
            return
        body = json.loads(answer.columns["response"][0].as_py())
        choice = body["choices"][0]
        final = choice["message"]["content"] if url == CHAT else choice["text"]
        if final != sent and final.startswith(sent):  # what was held back, or cut before a stop string
            yield _sse(_chunk(url, chunk_id, server, _delta(url, final[len(sent) :]), None))
        yield _sse(_chunk(url, chunk_id, server, _delta(url, ""), choice["finish_reason"]))
        if usage:
            yield _sse({**_chunk(url, chunk_id, server, None, None), "choices": [], "usage": body["usage"]})
        yield "data: [DONE]\n\n"
    finally:
        streams.pop(cid, None)


def _delta(url: str, text: str) -> dict[str, Any]:
    return {"content": text} if url == CHAT else {"text": text}


def _chunk(url: str, cid: str, server: Server, delta: dict[str, Any] | None, finish: str | None) -> dict[str, Any]:
    import time

    model = server.adapter.served_name  # type: ignore[attr-defined]
    if url == CHAT:
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": (delta or {}).get("text", ""), "finish_reason": finish, "logprobs": None}
        kind = "text_completion"
    return {"id": cid, "object": kind, "created": int(time.time()), "model": model, "choices": [choice]}


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
