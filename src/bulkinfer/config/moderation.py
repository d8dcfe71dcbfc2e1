"""``[moderation]``: OpenAI's moderation categories from a job's models (``serve`` answers
``POST /v1/moderations`` with them)."""

from __future__ import annotations

from pydantic import Field, field_validator

from ..core.errors import ConfigError
from .section import Section

__all__ = ["CATEGORIES", "CategoryConfig", "ModerationConfig"]

CATEGORIES = {
    "hate": ("text",), "hate/threatening": ("text",), "harassment": ("text",),
    "harassment/threatening": ("text",), "illicit": ("text",), "illicit/violent": ("text",),
    "self-harm": ("text", "image"), "self-harm/intent": ("text", "image"), "self-harm/instructions": ("text", "image"),
    "sexual": ("text", "image"), "sexual/minors": ("text",), "violence": ("text", "image"),
    "violence/graphic": ("text", "image"),
}  # fmt: skip
"""OpenAI's moderation categories (CreateModerationResponse: every one is required) and the
input types each may be applied to (``category_applied_input_types``' enums)."""


class CategoryConfig(Section):
    score: str
    """Expression over the models' columns giving the category's score in [0, 1] (the routing language:
    "max(nudenet.detections[label == 'FEMALE_BREAST_EXPOSED'].score)", "text.toxic")."""
    threshold: float = Field(default=0.5, ge=0, le=1)
    """The category is flagged where its score is at least this."""

    @field_validator("score")
    @classmethod
    def _score(cls, v: str) -> str:
        from ..core.expr import parse

        try:
            parse(v, "score")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return v


class ModerationConfig(Section):
    categories: dict[str, CategoryConfig] = Field(default_factory=dict)
    """Each of OpenAI's 13 categories (hate, hate/threatening, harassment, harassment/threatening, illicit,
    illicit/violent, self-harm, self-harm/intent, self-harm/instructions, sexual, sexual/minors, violence,
    violence/graphic) as {score = "...", threshold = 0.5}; one left out is refused at start."""
    text_column: str = "text"
    """The input column a request's text goes into (the column the text models read)."""
    image_column: str = "image"
    """The input column a request's picture goes into (the column the picture models read)."""

    def check(self) -> None:
        """Every category mapped, no other: an answer never carries a category nobody scored."""
        unknown = [c for c in self.categories if c not in CATEGORIES]
        if unknown:
            raise ConfigError(f"moderation.categories: {unknown[0]!r} is not one of OpenAI's ({', '.join(CATEGORIES)})")
        missing = [c for c in CATEGORIES if c not in self.categories]
        if missing:
            raise ConfigError(
                f"moderation.categories: {', '.join(missing)} not mapped to a score; every category OpenAI answers "
                'must come from a model (score = an expression over its columns; "0" says it is never scored)'
            )
