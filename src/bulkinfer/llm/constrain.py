"""Constrained decoding: a JSON schema becomes a grammar, and at every step only the tokens
the grammar allows next can be drawn, so every completion that ends parses and validates.

The library is llguidance (Microsoft's Rust engine behind guidance, one of vLLM's
structured-output backends). Against outlines-core and xgrammar it wins on what a batch
file needs: each request may carry its own schema, and llguidance computes the token mask
lazily from the grammar at each step (microseconds, no index built ahead), so a new schema
costs about a millisecond, where outlines-core builds an automaton over the whole vocabulary
per schema (seconds to minutes for large schemas) and xgrammar compiles per schema too; and
it needs nothing but its wheel (no torch.compile, no CUDA).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["Grammars", "Matcher", "schema_grammar"]

_JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: no tokens spent on indentation


def schema_grammar(schema: Mapping[str, Any] | str) -> str:
    """The llguidance grammar of a JSON schema; ``ValueError`` naming the problem when it is not one."""
    import llguidance

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ValueError(f"the JSON schema is not JSON ({exc})") from None
    if not isinstance(schema, Mapping):
        raise ValueError(f"a JSON schema is an object, not {type(schema).__name__}")
    grammar: str = llguidance.LLMatcher.grammar_from_json_schema(dict(schema), defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise ValueError(f"the JSON schema cannot be enforced: {problem}")
    return grammar


class Matcher:
    """One row's grammar state: masks the logits of the next token and takes the chosen one."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.m, self.vocab = matcher, vocab

    def mask(self, logits: Any) -> Any:
        import torch

        bits = np.unpackbits(np.frombuffer(self.m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.from_numpy(bits[: self.vocab].astype(bool)).to(logits.device)
        if allowed.shape[0] < logits.shape[0]:  # the model's vocabulary is padded past the tokenizer's
            pad = torch.zeros(logits.shape[0] - allowed.shape[0], dtype=torch.bool, device=logits.device)
            allowed = torch.cat([allowed, pad])
        return logits.masked_fill(~allowed, float("-inf"))

    def advance(self, token: int) -> bool:
        """Consume ``token``; True when the grammar is complete (only EOS may follow)."""
        if not self.m.consume_token(token):
            raise RuntimeError(f"constrained decoding: token {token} broke the grammar ({self.m.get_error()})")
        return bool(self.m.is_stopped())


class Grammars:
    """Makes matchers for one tokenizer (built on first use)."""

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        self.tokenizer, self.vocab = tokenizer, vocab
        self._ll: Any = None

    def matcher(self, grammar: str) -> Matcher:
        import llguidance
        import llguidance.hf

        if self._ll is None:
            self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab)
        m = llguidance.LLMatcher(self._ll, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"the JSON schema cannot be enforced: {m.get_error()}")
        return Matcher(m, self.vocab)
