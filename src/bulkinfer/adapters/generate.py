"""Text generation with a Hugging Face causal language model (``kind = "generate"``, detected
from a model directory whose config names a ``...ForCausalLM`` architecture), run by
transformers on CPU or CUDA.

Table mode: ``model.prompt_template = "Summarise: {text}"`` renders one prompt per row from
its columns (or ``model.text_column`` is the prompt). Prompts are tokenized in the reader
thread; the runner's length-sorted batching groups prompts of similar length; each batch
is **left-padded** with its attention mask (so the positions of every prompt's last token
line up and generation starts right after it) and generated with the KV cache. Greedy
decoding (the default, ``temperature = 0``) gives, token for token, what one-prompt-at-a-
time ``model.generate`` gives (tested).

Outputs: ``completion``, ``finish_reason`` (``stop``: EOS or a stop string; ``length``:
``max_tokens`` reached), ``prompt_tokens``, ``completion_tokens``. A prompt that does not
fit the model's context with room for ``max_tokens`` is an error row at tokenizing time,
never a failed batch; an empty prompt is answered as the model answers it (from BOS).
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, ModelError
from .base import Adapter, SetupContext

__all__ = ["GenerateAdapter", "is_causal_lm_dir", "template_columns"]


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


def template_columns(template: str) -> list[str]:
    """The columns a prompt template names (``{text}``, ``{title}``...), in order."""
    names = [field for _, field, _, _ in string.Formatter().parse(template) if field]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ConfigError(f"model.prompt_template: {{{bad[0]}}} is not a column name; use {{column}} placeholders")
    return list(dict.fromkeys(names))


@dataclass
class _Prompts:
    ids: list[list[int]]
    seeds: list[int]


class GenerateAdapter(Adapter):
    """One completion per row (see the module docstring)."""

    def __init__(
        self,
        model_path: str,
        text_column: str | None,
        prompt_template: str | None,
        max_tokens: int = 64,
        stop: Sequence[str] = (),
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not prompt_template and not text_column:
            raise ConfigError(
                'a generation model needs its prompts: model.prompt_template ("Summarise: {text}") or --text-column'
            )
        self.model_path = model_path
        self.template = prompt_template or "{" + str(text_column) + "}"
        self.input_columns = tuple(template_columns(self.template))
        self.max_tokens = max_tokens
        self.stop = [s for s in stop if s]
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.engine_name = "transformers"
        self.model: Any = None
        self.tokenizer: Any = None
        self.context = 0

    def setup(self, ctx: SetupContext) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(ctx.threads)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, torch_dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ModelError(f"model {self.model_path}: cannot load the causal language model ({exc})") from exc
        self.model.to(ctx.device).eval()
        self.device = ctx.device
        tok = self.tokenizer
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    # -- reader thread -------------------------------------------------------------------
    def preprocess(self, table: pa.Table) -> _Prompts:
        rows = table.select(list(self.input_columns)).to_pylist()
        prompts = [self.template.format_map({k: "" if v is None else v for k, v in r.items()}) for r in rows]
        ids = [self._encode(p) for p in prompts]
        if self.context:
            over = [i for i, x in enumerate(ids) if len(x) + self.max_tokens > self.context]
            if over:  # a row's error, not the job's: the runner bisects, so only these rows fail
                n = len(ids[over[0]])
                raise ValueError(
                    f"the prompt is {n} tokens; with max_tokens={self.max_tokens} it needs {n + self.max_tokens}, "
                    f"over the model's context of {self.context}"
                )
        return _Prompts(ids, [self._row_seed(p) for p in prompts])

    def _row_seed(self, prompt: str) -> int:
        """Each row's sampling seed: from the job's seed and the prompt, so a row regenerates the same
        completion whatever batch it lands in, and after a resume."""
        import hashlib

        digest = hashlib.blake2b(f"{self.seed}\0{prompt}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 63) - 1)

    def _encode(self, prompt: str) -> list[int]:
        ids: list[int] = self.tokenizer(prompt)["input_ids"]
        if not ids and self.tokenizer.bos_token_id is not None:  # an empty prompt starts from BOS
            ids = [self.tokenizer.bos_token_id]
        return ids

    def cost(self, features: _Prompts) -> Sequence[int]:
        return [len(x) + self.max_tokens for x in features.ids]

    def select(self, features: _Prompts, indices: np.ndarray) -> _Prompts:
        return _Prompts([features.ids[i] for i in indices], [features.seeds[i] for i in indices])

    # -- model thread --------------------------------------------------------------------------
    def predict(self, batch: _Prompts) -> Mapping[str, Any]:
        import torch

        tok = self.tokenizer
        width = max(len(x) for x in batch.ids)
        pad = tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch.ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch.ids])
        if self.temperature > 0:
            new = self._sample(input_ids, mask, batch.seeds)
        else:
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    max_new_tokens=self.max_tokens,
                    do_sample=False,
                    pad_token_id=pad,
                    eos_token_id=tok.eos_token_id,
                )
            new = out[:, width:].tolist()
        completions, reasons, counts = [], [], []
        for tokens in new:
            ended = tok.eos_token_id in tokens
            if ended:
                tokens = tokens[: tokens.index(tok.eos_token_id)]
            text = tok.decode(tokens, skip_special_tokens=True)
            hit = [text.index(s) for s in self.stop if s in text]
            if hit:
                text = text[: min(hit)]
            completions.append(text)
            reasons.append("stop" if ended or hit else "length")
            counts.append(len(tokens) + (1 if ended else 0))
        return {
            "completion": completions,
            "finish_reason": reasons,
            "prompt_tokens": [len(x) for x in batch.ids],
            "completion_tokens": counts,
        }

    def _sample(self, input_ids: Any, mask: Any, seeds: list[int]) -> list[list[int]]:
        """Temperature / top-p sampling with the KV cache, each row drawing from its own generator."""
        import inspect

        import torch

        gens = [torch.Generator().manual_seed(s) for s in seeds]
        # transformers 5 names the KV cache `cache`; 4.x `past_key_values`
        cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        eos = self.tokenizer.eos_token_id
        ids, att = input_ids.to(self.device), mask.to(self.device)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        past, step_ids, step_pos = None, ids, pos
        out: list[list[int]] = [[] for _ in seeds]
        done = [False] * len(seeds)
        with torch.inference_mode():
            for _ in range(self.max_tokens):
                res = self.model(
                    input_ids=step_ids, attention_mask=att, position_ids=step_pos, use_cache=True, **{cache_arg: past}
                )
                past = getattr(res, cache_arg)
                probs = torch.softmax(res.logits[:, -1, :].float() / self.temperature, dim=-1).cpu()
                nxt = []
                for i, p in enumerate(probs):
                    if self.top_p < 1.0:
                        sorted_p, order = torch.sort(p, descending=True)
                        keep = sorted_p.cumsum(0) - sorted_p < self.top_p  # the smallest set reaching top_p
                        p = torch.zeros_like(p).scatter(0, order[keep], sorted_p[keep])
                    token = int(torch.multinomial(p / p.sum(), 1, generator=gens[i]))
                    if not done[i]:
                        out[i].append(token)
                        done[i] = token == eos
                    nxt.append(token)
                if all(done):
                    break
                step_ids = torch.tensor(nxt, device=ids.device).unsqueeze(1)
                att = torch.cat([att, torch.ones_like(att[:, :1])], dim=1)
                step_pos = step_pos[:, -1:] + 1
        return out

    def close(self) -> None:
        self.model = None
