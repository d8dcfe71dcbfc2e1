"""The OpenAI API's request and response bodies for ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings``: one parser and one set of response shapes,
used by batch files (``source.format = "openai-batch"``) and by ``bulkinfer serve`` alike,
so a request answers the same offline and online.

A request the model cannot answer as asked raises :class:`BadRequest` naming the field
(``n > 1``, ``logprobs``, tools, an unknown ``url``, a ``model`` other than the job's...): it
is that request's error, never the job's.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "EMBEDDINGS",
    "BadRequest",
    "GenRequest",
    "batch_request",
    "check_model",
    "completion_body",
    "dumps",
    "embeddings_body",
    "embeddings_inputs",
    "generation_request",
    "request_id",
]

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
URLS = (CHAT, COMPLETIONS, EMBEDDINGS)

# parameters bulkinfer does not implement: refused when set to anything but their neutral value,
# so that no request is answered other than as it asked
_UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}


class BadRequest(ValueError):
    """A request bulkinfer will not run as written: HTTP 400, the field named in ``param``."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.param, self.code = param, code


class ModelNotFound(BadRequest):
    """A request naming a model the job does not run: HTTP 404 ``model_not_found``, as OpenAI answers it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "model", "model_not_found")


@dataclass(frozen=True)
class GenRequest:
    """A generation request, checked: the chat messages or the prompt, and how to sample."""

    url: str
    messages: list[dict[str, Any]] | None
    prompt: str | None
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    schema: dict[str, Any] | None
    stream: bool


def request_id(prefix: str, key: str) -> str:
    """A stable id for a response (the same custom_id gives the same id on a rerun)."""
    return f"{prefix}-{hashlib.blake2b(key.encode(), digest_size=12).hexdigest()}"


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise BadRequest(f"{name}: expected a number from {lo} to {hi}, got {value!r}", name)
    return float(value)


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise BadRequest("stop: expected a string or a list of up to 4 strings", "stop")


def _schema(body: Mapping[str, Any]) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise BadRequest(
                "response_format.json_schema.schema: expected the JSON schema (an object)", "response_format"
            )
        return dict(schema)
    raise BadRequest("response_format.type: expected text, json_object or json_schema", "response_format")


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}]: expected an object with a role and content", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text ones can be read by a text model
            if not all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content: expected a string", "messages")
        out.append({"role": m["role"], "content": content})
    return out


def generation_request(url: str, body: Any, model_names: Sequence[str]) -> GenRequest:
    """Check a chat or completions request body; :class:`BadRequest` says what is wrong."""
    if not isinstance(body, Mapping):
        raise BadRequest("body: expected a JSON object", "body")
    check_model(body, model_names)
    for name, neutral in _UNSUPPORTED.items():
        if name in body and body[name] not in neutral:
            raise BadRequest(f"{name}: not supported by bulkinfer; remove it from the request", name)
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("n: only one completion per request is supported (n = 1)", "n")
    messages = prompt = None
    if url == CHAT:
        messages = _messages(body)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt: expected one string (one prompt per request)", "prompt")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise BadRequest(f"max_tokens: expected a positive integer, got {limit!r}", "max_tokens")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"seed: expected an integer, got {seed!r}", "seed")
    return GenRequest(
        url=url,
        messages=messages,
        prompt=prompt,
        max_tokens=limit,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1.0,
        seed=seed,
        stop=_stop(body),
        schema=_schema(body),
        stream=bool(body.get("stream", False)),
    )


def batch_request(row: Mapping[str, Any]) -> tuple[Any, Any]:
    """The url and parsed body of a batch-file row (the reader's columns), checked as far as every
    route needs: no problem the reader found (``line_error``), ``POST``, a JSON body."""
    if row["line_error"]:
        raise BadRequest(row["line_error"], "custom_id")
    if row["method"] is None:
        raise BadRequest('method: missing; every request line says "method": "POST"', "method")
    if row["method"] != "POST":
        raise BadRequest(f"method: expected POST, got {row['method']!r}", "method")
    try:
        body = json.loads(row["body"]) if row["body"] is not None else None
    except ValueError as exc:
        raise BadRequest(f"body: not JSON ({exc})", "body") from None
    return row["url"], body


EMBEDDINGS_FIELDS = ("input", "model", "dimensions", "encoding_format", "user")
"""Every field of an OpenAI embeddings request (``openai.types.EmbeddingCreateParams``): each is
honoured or refused by name, none is ignored (``user`` identifies the caller; it changes no result)."""


def embeddings_inputs(body: Any, model_names: Sequence[str], dimension: int | None = None) -> tuple[list[str], str]:
    """The texts of an embeddings request and the encoding it asks for (float or base64);
    ``dimension``: the model's, which ``dimensions`` may only repeat (its vectors cannot be shortened)."""
    if not isinstance(body, Mapping):
        raise BadRequest("body: expected an object with input", "body")
    unknown = [k for k in body if k not in EMBEDDINGS_FIELDS]
    if unknown:
        raise BadRequest(
            f"{unknown[0]}: not a field of an embeddings request ({', '.join(EMBEDDINGS_FIELDS)})", unknown[0]
        )
    check_model(body, model_names)
    if body.get("dimensions") is not None and body["dimensions"] != dimension:
        size = f"have {dimension} dimensions" if dimension else "have the model's own size"
        raise BadRequest(
            f"dimensions: this model's embeddings {size} and cannot be shortened; omit dimensions"
            + (f" or give {dimension}" if dimension else ""),
            "dimensions",
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise BadRequest("user: expected a string", "user")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("input: expected a string or a non-empty list of strings", "input")
    if "" in texts:  # OpenAI refuses an empty input: there is nothing to embed
        raise BadRequest(f"input[{texts.index('')}]: an empty string; give text to embed", "input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest(f"encoding_format: expected float or base64, got {fmt!r}", "encoding_format")
    return texts, fmt


def check_model(body: Mapping[str, Any], names: Sequence[str]) -> None:
    if not names:
        return
    model = body.get("model")
    if model is None:
        raise BadRequest(f"model: missing; this job runs {names[0]!r} (as the API, a request names its model)", "model")
    if model not in names:
        raise ModelNotFound(f"model: this job runs {names[0]!r}; the request asks for {model!r}")


def completion_body(
    url: str,
    rid: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    created: int | None = None,
) -> dict[str, Any]:
    """The response body of a chat or completions request, as the synchronous API returns it."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    created = int(time.time()) if created is None else created
    if url == CHAT:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        kind = "text_completion"
    return {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
        "system_fingerprint": "bulkinfer",
    }


def embeddings_body(vectors: Any, model: str, tokens: int, encoding: str = "float") -> dict[str, Any]:
    """The response body of an embeddings request (``vectors``: a float32 matrix, its rows kept as
    numpy arrays: :func:`dumps` and serve's orjson write them without a Python float per value)."""
    import base64

    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(vec.tobytes()).decode() if encoding == "base64" else vec,
        }
        for i, vec in enumerate(vectors)
    ]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def dumps(body: Mapping[str, Any]) -> str:
    """A response body as compact JSON text (numpy vectors included)."""
    import orjson

    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY).decode()
