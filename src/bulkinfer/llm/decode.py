"""The batched decoding loop: prompts of any lengths, left-padded into one batch, generated
step by step with the KV cache, each row with its own sampling settings.

Every row has its ``max_tokens``, ``temperature`` (0: greedy), ``top_p``, seed, stop strings
and optionally a grammar (constrained decoding, :mod:`.constrain`). Left padding with the
attention mask and explicit positions puts every prompt's first token at position 0, so a
row's greedy tokens equal what ``model.generate`` gives for that prompt alone. A row that
ends (EOS, a stop string, its grammar complete, ``max_tokens``) leaves the batch: its rows
of the KV cache are dropped, so finished rows cost nothing.

Sampling draws from a ``torch.Generator`` per row seeded from the row's seed: a row's
completion does not depend on the batch it lands in, or on a resume.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Generated", "Sampling", "decode"]


@dataclass(frozen=True)
class Sampling:
    """How one row is generated."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    """Generate ``max_tokens`` every time, EOS or not (benchmarks)."""
    grammar: str | None = None
    """An llguidance grammar (see :func:`.constrain.schema_grammar`): only tokens it allows are drawn."""
    schema: str | None = None
    """The JSON schema (as text) the grammar was made from: what other engines (vLLM) take."""


@dataclass
class Generated:
    """One row's completion: its tokens (EOS excluded), text (cut before a stop string),
    why it ended (``stop`` or ``length``) and the tokens it cost (EOS included)."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    completion_tokens: int = 0


class _Row:
    def __init__(self, params: Sampling, matcher: Any) -> None:
        import torch

        self.params, self.matcher = params, matcher
        self.gen = torch.Generator().manual_seed(params.seed) if params.temperature > 0 else None
        self.out = Generated()
        self.done = False


def decode(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    params: Sequence[Sampling],
    device: str = "cpu",
    matcher_for: Callable[[str], Any] | None = None,
    on_token: Callable[[int, Generated, bool], None] | None = None,
) -> list[Generated]:
    """Generate a completion for every prompt (token ids). ``matcher_for(grammar)`` makes the
    grammar matcher of a constrained row; ``on_token(row, generated, done)`` sees every row's
    progress after each step (streaming)."""
    import torch

    rows = [_Row(p, matcher_for(p.grammar) if p.grammar and matcher_for else None) for p in params]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    width = max(len(x) for x in prompts)
    ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in prompts], device=device)
    att = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], device=device)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    forward = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in forward else "past_key_values"  # transformers 5 / 4.x
    extra = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
    live = list(range(len(rows)))  # the rows still generating, in the batch's order
    past: Any = None
    step_ids, step_pos = ids, pos
    limit = max(p.max_tokens for p in params)
    with torch.inference_mode():
        for _step in range(limit):
            inputs = {"input_ids": step_ids, "attention_mask": att, "position_ids": step_pos, cache_arg: past}
            res = model(**inputs, use_cache=True, **extra)
            past = getattr(res, cache_arg)
            logits = res.logits[:, -1, :].float()
            chosen = _choose(logits, [rows[i] for i in live])
            keep = []
            for j, i in enumerate(live):
                _advance(rows[i], chosen[j], eos, tokenizer)
                if on_token is not None:
                    on_token(i, rows[i].out, rows[i].done)
                if not rows[i].done:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(live):  # drop the finished rows from the batch and the KV cache
                sel = torch.tensor(keep, device=att.device)
                past.batch_select_indices(sel)
                att, step_pos = att[sel], step_pos[sel]
                chosen = [chosen[j] for j in keep]
                live = [live[j] for j in keep]
            step_ids = torch.tensor(chosen, device=att.device).unsqueeze(1)
            att = torch.cat([att, torch.ones_like(att[:, :1])], dim=1)
            step_pos = step_pos[:, -1:] + 1
    for r in rows:
        if not r.done:  # max_tokens of the longest row reached
            r.out.text = _text(tokenizer, r.out.tokens, r.params.stop)[0]
    return [r.out for r in rows]


def _choose(logits: Any, rows: list[_Row]) -> list[int]:
    """The next token of each live row: the argmax (greedy) or a draw, among the tokens its
    grammar allows."""
    import torch

    for j, r in enumerate(rows):
        if r.matcher is not None:
            logits[j] = r.matcher.mask(logits[j])
    greedy = logits.argmax(-1).tolist()
    out = []
    for j, r in enumerate(rows):
        p = r.params
        if p.temperature <= 0:
            out.append(int(greedy[j]))
            continue
        probs = torch.softmax(logits[j] / p.temperature, dim=-1).cpu()
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < p.top_p  # the smallest set reaching top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        out.append(int(torch.multinomial(probs / probs.sum(), 1, generator=r.gen)))
    return out


def _advance(row: _Row, token: int, eos: int | None, tokenizer: Any) -> None:
    """Take ``token`` into ``row``; mark it done at EOS, a stop string, a complete grammar or max_tokens."""
    out, p = row.out, row.params
    out.completion_tokens += 1
    if token == eos and not p.ignore_eos:
        row.done, out.finish_reason = True, "stop"
        out.text = _text(tokenizer, out.tokens, p.stop)[0]
        return
    out.tokens.append(token)
    if row.matcher is not None and row.matcher.advance(token):  # the grammar is complete
        row.done, out.finish_reason = True, "stop"
    if p.stop:
        out.text, hit = _text(tokenizer, out.tokens, p.stop)
        if hit:
            row.done, out.finish_reason = True, "stop"
            return
    if not row.done and len(out.tokens) >= p.max_tokens:
        row.done, out.finish_reason = True, "length"
    if row.done and not p.stop:
        out.text = _text(tokenizer, out.tokens, ())[0]


def _text(tokenizer: Any, tokens: list[int], stop: Sequence[str]) -> tuple[str, bool]:
    """The completion's text, cut before the first stop string; whether one was found."""
    text: str = tokenizer.decode(tokens, skip_special_tokens=True)
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)
