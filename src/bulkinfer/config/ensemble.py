"""``[models.<name>]`` and ``[decision]``: several models over one input, and the rule that
turns their columns into one decision (publish / review / block)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from ..core.errors import ConfigError
from .model import ModelConfig
from .section import Section

__all__ = ["DecisionConfig", "MemberConfig", "check_member_name"]


class MemberConfig(ModelConfig):
    """One model of a several-model job: the fields of ``[model]``, and how this model runs
    (its own batch size and engine; the job's ``[runtime]`` for the rest). Its input column may
    be another model's output column (``text_column = "ocr.text"``)."""

    batch_size: int | None = Field(default=None, ge=1)
    """Rows per call of this model; default: the model's own (8 for NudeNet, 16 for text, ...)."""
    engine: Literal["auto", "torch", "onnxruntime", "openvino"] | None = None
    """This model's engine; default: the job's runtime.engine."""
    precision: Literal["fp32", "bf16", "fp16", "int8", "auto"] | None = None
    """This model's precision; a several-model job runs each in fp32 (the quality gate judges one model
    at a time): any other is refused before a row runs."""


class DecisionConfig(Section):
    """Rules over any models' columns, tried in order: the first that holds names the row's
    ``decision``; no rule holding gives ``default``."""

    rules: dict[str, str] = Field(min_length=1)
    """Outcome -> expression ([decision.rules] block = "max(nudenet.detections[label == 'X'].score) > 0.9");
    the routing language with list filters and max/min/sum/mean/count/any/all (docs/ensembles.md)."""
    default: str = "publish"
    """The decision of a row no rule takes."""
    on_error: str = "review"
    """The decision of a row no rule takes where a model failed on it (a missing score publishes nothing)."""

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: dict[str, str]) -> dict[str, str]:
        from ..core.expr import parse

        for outcome, when in v.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", outcome):
                raise ValueError(f"{outcome!r}: an outcome is letters, digits, _ and -")
            try:
                parse(when, f"decision.rules.{outcome}")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v


def check_member_name(name: str) -> None:
    """A model's name prefixes its columns (``<name>.<column>``): letters, digits and _ only."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ConfigError(
            f"models.{name}: a model's name prefixes its output columns (name.column); use letters, digits and _"
        )
