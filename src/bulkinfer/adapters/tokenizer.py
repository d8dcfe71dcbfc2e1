"""A text model's tokenizer, read from its ``tokenizer.json`` by the ``tokenizers`` library (the
Rust tokenizer that transformers' fast tokenizers wrap): the same token ids, without importing
transformers, which pulls in torch (about 2 CPU seconds and hundreds of MB at every start of a
``run``, a ``serve``, a Ray actor or a Spark Python worker). A model folder without a
``tokenizer.json`` gets transformers' ``AutoTokenizer``, as before."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FastTokenizer", "load_tokenizer"]

_NO_LIMIT = 1_000_000_000_000_000_019_884_624_838_656  # transformers' "no model_max_length"


def load_tokenizer(directory: Path) -> Any:
    """The tokenizer of the model in ``directory``: :class:`FastTokenizer` when it has a
    ``tokenizer.json``, else transformers' (which may convert a slow one)."""
    if (directory / "tokenizer.json").is_file():
        return FastTokenizer(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


class FastTokenizer:
    """What the text adapter asks of a tokenizer: ``tok(texts, truncation=..., max_length=...)["input_ids"]``,
    ``all_special_ids``, ``pad_token_id`` and ``model_max_length``."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        path = str(directory / "tokenizer.json")
        try:
            self._cut, self._whole = Tokenizer.from_file(path), Tokenizer.from_file(path)
        except Exception as exc:  # the Rust library raises a plain Exception on a bad file
            raise ValueError(f"{path}: not a tokenizer file ({exc})") from exc
        for tok in (self._cut, self._whole):
            tok.no_padding()
        self._whole.no_truncation()
        self._limit: int | None = None
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.model_max_length = int(config.get("model_max_length") or _NO_LIMIT)
        self.all_special_ids = sorted(i for i, t in self._cut.get_added_tokens_decoder().items() if t.special)
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_token_id: int | None = self._cut.token_to_id(pad) if pad else None

    def __call__(
        self,
        text: str | Sequence[str],
        *,
        truncation: bool = False,
        max_length: int | None = None,
        padding: bool = False,
        return_attention_mask: bool = False,
        return_token_type_ids: bool = False,
    ) -> dict[str, Any]:
        """Token ids with the model's special tokens; cut at ``max_length`` (special tokens
        included) when ``truncation``. Only ids: no padding, masks or type ids are made."""
        if padding or return_attention_mask or return_token_type_ids:
            raise ValueError("FastTokenizer gives token ids only (no padding, masks or type ids)")
        tok = self._whole
        if truncation:
            limit = max_length or min(self.model_max_length, 512)
            if limit != self._limit:
                self._cut.enable_truncation(limit)
                self._limit = limit
            tok = self._cut
        if isinstance(text, str):
            return {"input_ids": tok.encode(text).ids}
        return {"input_ids": [e.ids for e in tok.encode_batch(list(text))]}
