"""Text generation with a Hugging Face causal language model (``kind = "generate"``, detected
from a model directory whose config names a ``...ForCausalLM`` architecture), run by
transformers on CPU or CUDA.

Table mode: ``model.prompt_template = "Summarise: {text}"`` renders one prompt per row from
its columns (or ``model.text_column`` is the prompt), or ``model.messages`` renders chat
messages through the tokenizer's chat template. Request mode (an OpenAI batch file): each
row is a ``/v1/chat/completions`` or ``/v1/completions`` request, checked by
:mod:`bulkinfer.llm.openai_api`, answered with the synchronous API's response body.

Prompts are tokenized in the reader thread; the runner's length-sorted batching groups
prompts of similar length; :func:`bulkinfer.llm.decode.decode` generates each batch
left-padded with the KV cache. Greedy decoding (``temperature = 0``) gives, token for
token, what one-prompt-at-a-time ``model.generate`` gives (tested). ``model.json_schema``
(or a request's ``response_format``) constrains decoding to the schema.

Table outputs: ``completion``, ``finish_reason`` (``stop``: EOS, a stop string or the JSON
complete; ``length``: ``max_tokens`` reached), ``prompt_tokens``, ``completion_tokens``,
and with ``model.expand_json`` one typed column per top-level field of the schema. A
prompt that does not fit the model's context with room for ``max_tokens`` is an error row
at tokenizing time, never a failed batch; an empty prompt is answered from BOS.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..config import ModelConfig
from ..core.errors import ConfigError, ModelError
from ..llm.openai_api import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    URLS,
    BadRequest,
    batch_request,
    completion_body,
    dumps,
    generation_request,
)
from ..llm.prompts import chat_prompt, message_columns, render, template_columns
from .protocol import Adapter, RowsRejected, SetupContext

__all__ = [
    "GenerateAdapter",
    "Prompts",
    "expanded",
    "is_causal_lm_dir",
    "json_columns",
    "load_schema",
    "template_columns",
]

REQUEST_COLUMNS = ("custom_id", "method", "url", "body", "line_error")


def is_causal_lm_dir(path: Path) -> bool:
    """A Hugging Face model directory of a causal language model."""
    cfg = path / "config.json"
    if not (path.is_dir() and cfg.is_file()):
        return False
    try:
        archs = json.loads(cfg.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs)  # GPT-2 says LMHeadModel


_JSON_TYPES = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


def _arrow_type(spec: Mapping[str, Any]) -> pa.DataType | None:
    """The Arrow type of a JSON schema node; None: kept as JSON text."""
    kind = spec.get("type")
    if kind is None and "enum" in spec and all(isinstance(v, str) for v in spec["enum"]):
        return pa.string()
    if isinstance(kind, str) and kind in _JSON_TYPES:
        return _JSON_TYPES[kind]
    if kind == "array" and isinstance(spec.get("items"), Mapping):
        item = _arrow_type(spec["items"])
        return pa.list_(item) if item is not None else None
    return None


def json_columns(schema: Mapping[str, Any]) -> list[tuple[str, pa.DataType | None]]:
    """The output columns ``expand_json`` makes from a schema's top-level properties."""
    props = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(props, Mapping) or not props:
        raise ConfigError("model.expand_json: the JSON schema must be an object with properties")
    return [(name, _arrow_type(spec) if isinstance(spec, Mapping) else None) for name, spec in props.items()]


def expanded(fields: list[tuple[str, pa.DataType | None]], texts: list[str | None]) -> dict[str, pa.Array]:
    """The JSON completions' top-level ``fields`` as typed columns (null where a completion is
    None: cut by max_tokens, or not JSON the schema allows)."""
    objs = []
    for t in texts:
        try:
            objs.append(json.loads(t) if t else {})
        except ValueError:
            objs.append({})
    out = {}
    for name, arrow_type in fields:
        values = [o.get(name) if isinstance(o, dict) else None for o in objs]
        if arrow_type is None:
            out[name] = pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
        else:
            out[name] = pa.array(values, arrow_type)
    return out


def load_schema(value: dict[str, Any] | str | None) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    try:
        loaded = json.loads(Path(value).expanduser().read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.json_schema: cannot read the JSON schema {value} ({exc})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"model.json_schema: {value} holds a {type(loaded).__name__}, not a JSON schema object")
    return loaded


@dataclass
class Prompts:
    ids: list[list[int]]
    params: list[Any]  # llm.decode.Sampling per row
    urls: list[str] | None = None  # request mode: what each row asked (chat or completions)
    keys: list[str] | None = None  # request mode: each row's custom_id


class GenerateAdapter(Adapter):
    """One completion per row or per request (see the module docstring)."""

    def __init__(self, model_path: str, m: ModelConfig, requests: bool = False, precision: str = "fp32") -> None:
        self.model_path, self.requests, self.precision = model_path, requests, precision
        self.served_name = m.served_name or Path(model_path).name
        self.names = list(dict.fromkeys([self.served_name, m.name, model_path]))
        self.messages = [dict(x) for x in m.messages]
        self.template = m.prompt_template or ("{" + str(m.text_column) + "}" if m.text_column else None)
        if requests:
            self.input_columns: tuple[str, ...] = REQUEST_COLUMNS
        elif self.messages:
            self.input_columns = tuple(message_columns(self.messages))
        elif self.template:
            self.input_columns = tuple(template_columns(self.template))
        else:
            raise ConfigError(
                'a generation model needs its prompts: model.prompt_template ("Summarise: {text}"), '
                "model.messages or --text-column"
            )
        self.chat_template = m.chat_template
        self.max_tokens, self.stop = m.max_new_tokens, tuple(s for s in m.stop if s)
        self.temperature, self.top_p, self.seed = m.temperature, m.top_p, m.seed
        self.ignore_eos = m.ignore_eos
        self.schema = load_schema(m.json_schema)
        self.grammar: str | None = None
        if self.schema is not None:
            from ..llm.constrain import schema_grammar

            try:
                self.grammar = schema_grammar(self.schema)
            except ValueError as exc:
                raise ConfigError(f"model.json_schema: {exc}") from None
        self.expand = json_columns(self.schema) if m.expand_json and self.schema else []
        if m.expand_json and self.schema is None:
            raise ConfigError("model.expand_json: needs model.json_schema (the fields to expand)")
        self.engine_name = "transformers"
        self.model: Any = None
        self.tokenizer: Any = None
        self.grammars: Any = None
        self._compiled: dict[str, str] = {}
        #: serve's streaming requests: custom_id -> called with (Generated so far, done) after every token
        self.streams: dict[str, Any] = {}
        self.context = 0

    def setup(self, ctx: SetupContext) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from ..core.hardware import require_device
        from ..llm.constrain import Grammars

        require_device(ctx.device)
        torch.set_num_threads(ctx.threads)
        self.load_tokenizer()
        try:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ModelError(f"model {self.model_path}: cannot load the causal language model ({exc})") from exc
        self.model.to(ctx.device).eval()
        self.device = ctx.device
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.grammars = Grammars(self.tokenizer, int(self.model.config.vocab_size))

    def load_tokenizer(self) -> None:
        """The tokenizer the reader thread tokenizes with (and the chat template it renders)."""
        from transformers import AutoTokenizer

        try:
            self.tokenizer = tok = AutoTokenizer.from_pretrained(self.model_path)
        except (OSError, ValueError) as exc:
            raise ModelError(f"model {self.model_path}: cannot load its tokenizer ({exc})") from exc
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        if self.chat_template:
            tok.chat_template = self.chat_template
        if self.messages and not getattr(tok, "chat_template", None):
            raise ConfigError(
                f"model.messages: the tokenizer of {self.model_path} has no chat template; "
                "set model.chat_template or use model.prompt_template"
            )

    # -- reader thread -------------------------------------------------------------------
    def preprocess(self, table: pa.Table) -> Prompts:
        rows = table.select(list(self.input_columns)).to_pylist()
        rejected: dict[int, Exception] = {}
        ids: list[list[int]] = []
        params: list[Any] = []
        urls: list[str] = []
        for pos, row in enumerate(rows):
            try:
                x, p, url = self._request(row) if self.requests else self._row(row)
                self._fits(x, p.max_tokens)
            except (BadRequest, ValueError) as exc:
                rejected[pos] = exc
                continue
            ids.append(x)
            params.append(p)
            urls.append(url)
        if rejected:  # these rows' errors, not the job's: the rest is preprocessed again
            raise RowsRejected(rejected)
        keys = [r["custom_id"] for r in rows] if self.requests else None
        return Prompts(ids, params, urls if self.requests else None, keys)

    def _row(self, row: Mapping[str, Any]) -> tuple[list[int], Any, str]:
        from ..llm.decode import Sampling

        if self.messages:
            msgs = [{"role": m["role"], "content": render(m["content"], row)} for m in self.messages]
            prompt, chat = chat_prompt(self.tokenizer, msgs), True
        else:
            prompt, chat = render(str(self.template), row), False
        seed = self._row_seed(prompt)
        p = Sampling(
            self.max_tokens, self.temperature, self.top_p, seed, self.stop, self.ignore_eos, self.grammar,
            json.dumps(self.schema) if self.schema is not None else None,
        )  # fmt: skip
        return self._encode(prompt, chat), p, ""

    def _request(self, row: Mapping[str, Any]) -> tuple[list[int], Any, str]:
        from ..llm.decode import Sampling

        url, body = batch_request(row)
        if url == EMBEDDINGS:
            raise BadRequest("url: this job's model generates text; /v1/embeddings needs an embedding model", "url")
        if url not in URLS:
            raise BadRequest(f"url: expected {CHAT} or {COMPLETIONS}, got {url!r}", "url")
        req = generation_request(url, body, self.names)
        if req.stream:
            raise BadRequest("stream: a batch request is answered whole; remove stream", "stream")
        if req.messages is not None:
            prompt, chat = chat_prompt(self.tokenizer, req.messages), True
        else:
            prompt, chat = str(req.prompt), False
        grammar = self._grammar(req.schema) if req.schema is not None else None
        seed = req.seed if req.seed is not None else self._row_seed(f"{row['custom_id']}\0{prompt}")
        limit = req.max_tokens or self.max_tokens
        schema = json.dumps(req.schema) if req.schema is not None else None
        params = Sampling(limit, req.temperature, req.top_p, seed, req.stop, grammar=grammar, schema=schema)
        return self._encode(prompt, chat), params, url

    def _grammar(self, schema: dict[str, Any]) -> str:
        from ..llm.constrain import schema_grammar

        key = json.dumps(schema, sort_keys=True)
        if key not in self._compiled:
            try:
                self._compiled[key] = schema_grammar(schema)
            except ValueError as exc:
                raise BadRequest(f"response_format: {exc}", "response_format") from None
        return self._compiled[key]

    def _fits(self, ids: list[int], max_tokens: int) -> None:
        if self.context and len(ids) + max_tokens > self.context:
            raise BadRequest(
                f"the prompt is {len(ids)} tokens; with max_tokens={max_tokens} it needs {len(ids) + max_tokens}, "
                f"over the model's context of {self.context}",
                "max_tokens",
            )

    def _row_seed(self, prompt: str) -> int:
        """Each row's sampling seed: from the job's seed and the prompt, so a row regenerates the same
        completion whatever batch it lands in, and after a resume."""
        digest = hashlib.blake2b(f"{self.seed}\0{prompt}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)

    def _encode(self, prompt: str, chat: bool = False) -> list[int]:
        # a chat template writes the special tokens (BOS) itself
        ids: list[int] = self.tokenizer(prompt, add_special_tokens=not chat)["input_ids"]
        if not ids and self.tokenizer.bos_token_id is not None:  # an empty prompt starts from BOS
            ids = [self.tokenizer.bos_token_id]
        return ids

    def cost(self, features: Prompts) -> Sequence[int]:
        return [len(x) + p.max_tokens for x, p in zip(features.ids, features.params, strict=True)]

    def select(self, features: Prompts, indices: np.ndarray) -> Prompts:
        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in indices]

        ids, params = [features.ids[i] for i in indices], [features.params[i] for i in indices]
        return Prompts(ids, params, pick(features.urls), pick(features.keys))

    # -- model thread --------------------------------------------------------------------------
    def predict(self, batch: Prompts) -> Mapping[str, Any]:
        from ..llm.decode import decode

        on_token = None
        if self.streams and batch.keys:  # serve: some rows stream their tokens as they come
            listeners = [self.streams.get(k) for k in batch.keys]

            def on_token(i: int, generated: Any, done: bool) -> None:
                listener = listeners[i]
                if listener is not None:
                    listener(generated, done)

        out = decode(self.model, self.tokenizer, batch.ids, batch.params, self.device, self.grammars.matcher, on_token)
        return self.columns(batch, out)

    def columns(self, batch: Prompts, out: list[Any]) -> dict[str, Any]:
        """The output columns of a batch's completions (``llm.decode.Generated``)."""
        prompt_tokens = [len(x) for x in batch.ids]
        used = [g.completion_tokens for g in out]
        if self.requests:
            assert batch.urls is not None and batch.keys is not None
            bodies = [
                dumps(completion_body(url, _response_id(url, key), self.served_name, g.text, g.finish_reason, p, n))
                for url, key, g, p, n in zip(batch.urls, batch.keys, out, prompt_tokens, used, strict=True)
            ]
            return {"response": bodies, "prompt_tokens": prompt_tokens, "completion_tokens": used}
        columns: dict[str, Any] = {
            "completion": [g.text for g in out],
            "finish_reason": [g.finish_reason for g in out],
            "prompt_tokens": prompt_tokens,
            "completion_tokens": used,
        }
        if self.expand:
            columns.update(expanded(self.expand, [g.text if g.finish_reason == "stop" else None for g in out]))
        return columns

    def close(self) -> None:
        self.model = None


def _response_id(url: str, key: str) -> str:
    from ..llm.openai_api import request_id

    return request_id("chatcmpl" if url == CHAT else "cmpl", key)
