"""The base of every config section: frozen, unknown fields refused, attribute docstrings as
the field's documentation (``--help`` and the docs' reference)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Section"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
