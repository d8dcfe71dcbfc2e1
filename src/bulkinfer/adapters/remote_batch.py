"""``model.kind = "remote-batch"``: a table's rows as requests to an OpenAI-compatible Batch
API, and its answers back as the columns a local model writes.

This adapter only translates. The runner (:mod:`bulkinfer.runners.remote`) uploads the
request files, creates the batches and polls them. Each row becomes one request body:

- ``/v1/chat/completions``: ``model.messages`` (``{column}`` placeholders), else one user
  message of ``model.prompt_template`` or the text column;
- ``/v1/completions``: the prompt template or the text column;
- ``/v1/embeddings``: the text column.

The generation settings are those of a local generation model: ``max_new_tokens`` as
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, and ``json_schema`` as a
strict ``response_format``. The output columns are also a local model's: ``completion``,
``finish_reason``, ``prompt_tokens``, ``completion_tokens`` (and the JSON's fields with
``expand_json``), or ``embedding``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..config import ModelConfig
from ..core.errors import ConfigError
from ..llm.openai_api import CHAT, EMBEDDINGS
from ..llm.prompts import message_columns, render, template_columns
from .generate import expanded, json_columns, load_schema
from .protocol import Adapter

__all__ = ["RemoteRequests", "remote_digest"]


def remote_digest(m: ModelConfig) -> str:
    """What identifies a remote model for the job's fingerprint: where, which, which endpoint."""
    return hashlib.sha256(f"{m.base_url}\0{m.name}\0{m.endpoint}".encode()).hexdigest()[:32]


class RemoteRequests(Adapter):
    """Request bodies of rows, and columns of answers."""

    def __init__(self, m: ModelConfig) -> None:
        if not m.base_url:
            raise ConfigError("model.base_url: a remote-batch model needs the Batch API's URL (https://.../v1)")
        for name, bad in (("chat_template", m.chat_template), ("ignore_eos", m.ignore_eos), ("options", m.options)):
            if bad:
                raise ConfigError(f"model.{name}: applies to a local model; a remote Batch API has no such setting")
        self.m, self.endpoint = m, m.endpoint
        self.messages = [dict(x) for x in m.messages]
        self.template = m.prompt_template or ("{" + str(m.text_column) + "}" if m.text_column else None)
        if self.endpoint == EMBEDDINGS:
            if not m.text_column or self.messages or m.prompt_template or m.json_schema:
                raise ConfigError("model.text_column: a remote embeddings job embeds one text column (and no prompt)")
            self.input_columns: tuple[str, ...] = (m.text_column,)
        elif self.messages and self.endpoint == CHAT:
            self.input_columns = tuple(message_columns(self.messages))
        elif self.messages:
            raise ConfigError("model.messages: chat messages go to /v1/chat/completions; set model.endpoint")
        elif self.template:
            self.input_columns = tuple(template_columns(self.template))
        else:
            raise ConfigError("a remote generation job needs its prompts: model.prompt_template, model.messages "
                              "or --text-column")  # fmt: skip
        self.schema = load_schema(m.json_schema)
        if m.expand_json and self.schema is None:
            raise ConfigError("model.expand_json: needs model.json_schema (the fields to expand)")
        self.expand = json_columns(self.schema) if m.expand_json and self.schema else []
        self.engine_name = "remote-batch"

    def body(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The request body of one row (``ValueError`` when the row cannot make one)."""
        m = self.m
        if self.endpoint == EMBEDDINGS:
            text = row[self.input_columns[0]]
            if text is None:
                raise ValueError(f"null text in column {self.input_columns[0]!r}")
            return {"model": m.name, "input": str(text)}
        body: dict[str, Any] = {"model": m.name, "max_tokens": m.max_new_tokens, "temperature": m.temperature,
                                "top_p": m.top_p, "seed": m.seed}  # fmt: skip
        if m.stop:
            body["stop"] = list(m.stop)
        if self.endpoint == CHAT:
            if self.messages:
                body["messages"] = [{"role": x["role"], "content": render(x["content"], row)} for x in self.messages]
            else:
                body["messages"] = [{"role": "user", "content": render(str(self.template), row)}]
            if self.schema is not None:
                body["response_format"] = {
                    "type": "json_schema", "json_schema": {"name": "output", "schema": self.schema, "strict": True},
                }  # fmt: skip
        else:
            if self.schema is not None:
                raise ConfigError("model.json_schema: a structured answer needs /v1/chat/completions (response_format)")
            body["prompt"] = render(str(self.template), row)
        return body

    def columns(self, answers: list[dict[str, Any]]) -> dict[str, Any]:
        """The output columns of response bodies (one per row, in row order)."""
        if self.endpoint == EMBEDDINGS:
            return {"embedding": np.asarray([a["data"][0]["embedding"] for a in answers], dtype=np.float32)}
        choices = [a["choices"][0] for a in answers]
        texts = [c["message"]["content"] if self.endpoint == CHAT else c["text"] for c in choices]
        usage = [a.get("usage") or {} for a in answers]
        columns: dict[str, Any] = {
            "completion": pa.array(texts, pa.string()),
            "finish_reason": pa.array([c.get("finish_reason") for c in choices], pa.string()),
            "prompt_tokens": pa.array([u.get("prompt_tokens") for u in usage], pa.int64()),
            "completion_tokens": pa.array([u.get("completion_tokens") for u in usage], pa.int64()),
        }
        if self.expand:
            done = [t if c.get("finish_reason") == "stop" else None for t, c in zip(texts, choices, strict=True)]
            columns.update(expanded(self.expand, done))
        return columns

    @staticmethod
    def check_answer(endpoint: str, body: Any) -> str | None:
        """Why a response body is not an answer this job can read (None: it is one)."""
        try:
            if endpoint == EMBEDDINGS:
                vector = body["data"][0]["embedding"]
                return None if isinstance(vector, list) and vector else "no embedding in the answer"
            choice = body["choices"][0]
            text = choice["message"]["content"] if endpoint == CHAT else choice["text"]
            return None if isinstance(text, str) else "no text in the answer"
        except (KeyError, IndexError, TypeError):
            return f"not a {endpoint} answer: {json.dumps(body)[:200]}"

    def predict(self, batch: Any) -> Any:
        raise ConfigError("a remote-batch model runs through its Batch API (the remote runner), not predict")
