"""Prompts: a row's columns rendered into a prompt template, or into chat messages that the
tokenizer's chat template turns into the model's prompt format."""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import ConfigError

__all__ = ["chat_prompt", "message_columns", "render", "template_columns"]


def template_columns(template: str, where: str = "model.prompt_template") -> list[str]:
    """The columns a template names (``{text}``, ``{title}``...), in order."""
    try:
        names = [field for _, field, _, _ in string.Formatter().parse(template) if field]
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}; write literal braces as {{{{ and }}}}") from None
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ConfigError(f"{where}: {{{bad[0]}}} is not a column name; use {{column}} placeholders")
    return list(dict.fromkeys(names))


def message_columns(messages: Sequence[Mapping[str, str]]) -> list[str]:
    """The columns chat message templates name, checking each message has a role and content."""
    names: list[str] = []
    for i, m in enumerate(messages):
        if set(m) != {"role", "content"}:
            raise ConfigError(f"model.messages[{i}]: a message is {{role = ..., content = ...}}, got {sorted(m)}")
        names += template_columns(m["content"], f"model.messages[{i}].content")
    return list(dict.fromkeys(names))


def render(template: str, row: Mapping[str, Any]) -> str:
    return template.format_map({k: "" if v is None else v for k, v in row.items()})


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The model's prompt for ``messages`` by the tokenizer's chat template, ready for the
    assistant's answer. ``ValueError`` when the messages do not fit the template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "the model's tokenizer has no chat template (tokenizer_config.json chat_template); "
            "use model.prompt_template, or set model.chat_template"
        )
    try:
        text: str = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja2's errors: the template rejected these messages
        raise ValueError(f"the chat template rejected the messages ({exc})") from None
    return text
