"""OpenAI's moderations API over a job's models: a request's inputs as rows, and the models'
columns as OpenAI's answer (``CreateModerationResponse``).

A request's ``input`` is a string, a list of strings (one result each), or a list of
multi-modal parts (``{"type": "text", "text"}``, ``{"type": "image_url", "image_url":
{"url": "data:image/png;base64,..."}}``) that together are one input: one result. Pictures
come as data URLs only (a server that fetches nothing). Each category's score is its
expression over the row's columns (null, where its models did not run: 0), flagged at its
threshold; ``category_applied_input_types`` lists the input types the category's models read
that the input had, within those OpenAI applies the category to.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..config.moderation import CATEGORIES, ModerationConfig
from ..core.expr import evaluate, parse
from .openai_api import BadRequest, check_model

__all__ = ["MODERATION_FIELDS", "moderation_body", "moderation_rows"]

MODERATION_FIELDS = ("input", "model")
"""Every field of an OpenAI moderations request (``openai.types.ModerationCreateParams``)."""
_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,(.*)", re.S)


def moderation_rows(
    body: Any, model_names: Sequence[str], cfg: ModerationConfig, max_image_bytes: int
) -> list[dict[str, Any]]:
    """The rows of a moderations request (its text and picture columns), one per result."""
    if not isinstance(body, Mapping):
        raise BadRequest("body: expected an object with input", "body")
    unknown = [k for k in body if k not in MODERATION_FIELDS]
    if unknown:
        raise BadRequest(f"{unknown[0]}: not a field of a moderations request (input, model)", unknown[0])
    if body.get("model") is not None:
        check_model(body, model_names)
    given = body.get("input")
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not given:
        raise BadRequest("input: expected a string, a list of strings or a list of text and image_url parts", "input")
    if all(isinstance(t, str) for t in given):
        return [{cfg.text_column: t, cfg.image_column: None} for t in given]
    return [_parts(given, cfg, max_image_bytes)]


def _parts(parts: list[Any], cfg: ModerationConfig, max_image_bytes: int) -> dict[str, Any]:
    """Multi-modal parts: their texts (joined by lines) and their one picture, as one row."""
    texts, images = [], []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and isinstance(part.get("image_url"), Mapping):
            images.append(_picture(part["image_url"].get("url"), f"input[{i}].image_url.url", max_image_bytes))
        else:
            raise BadRequest(
                f"input[{i}]: expected {{type: text, text}} or {{type: image_url, image_url: {{url}}}}", f"input[{i}]"
            )
    if len(images) > 1:
        raise BadRequest(f"input: {len(images)} pictures in one input; give one (as OpenAI's API takes)", "input")
    return {cfg.text_column: "\n".join(texts) if texts else None, cfg.image_column: images[0] if images else None}


def _picture(url: Any, where: str, limit: int) -> bytes:
    match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if match is None:
        raise BadRequest(f"{where}: expected a data URL (data:image/...;base64,...); this server fetches no URL", where)
    try:
        data = base64.b64decode(match.group(1), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}: the data URL's base64 does not decode", where) from None
    if len(data) > limit:
        raise BadRequest(f"{where}: the picture is {len(data)} bytes, over serve.max_image_bytes={limit}", where)
    return data


def moderation_body(
    table: pa.Table, cfg: ModerationConfig, kinds: Mapping[str, set[str]], model: str
) -> dict[str, Any]:
    """OpenAI's answer for ``table`` (the request's rows and the models' columns); ``kinds``:
    the input types (text, image) each category's models read."""
    scores = {c: _scores(table, cfg.categories[c].score, c) for c in CATEGORIES}
    given = [
        {k for k, col in (("text", cfg.text_column), ("image", cfg.image_column)) if row.get(col) is not None}
        for row in table.select([cfg.text_column, cfg.image_column]).to_pylist()
    ]
    results = []
    for i, present in enumerate(given):
        flags = {c: scores[c][i] >= cfg.categories[c].threshold for c in CATEGORIES}
        applied = {c: [k for k in allowed if k in present and k in kinds.get(c, set())]
                   for c, allowed in CATEGORIES.items()}  # fmt: skip
        results.append({
            "flagged": any(flags.values()), "categories": flags,
            "category_scores": {c: scores[c][i] for c in CATEGORIES}, "category_applied_input_types": applied,
        })  # fmt: skip
    return {"id": f"modr-{uuid.uuid4().hex}", "model": model, "results": results}


def _scores(table: pa.Table, score: str, category: str) -> list[float]:
    """The category's score of each row: its expression, a number (null: 0)."""
    value = evaluate(parse(score, f"moderation.categories.{category}.score"), table)
    values = [value.as_py()] * table.num_rows if isinstance(value, pa.Scalar) else value.to_pylist()
    return [float(v) if v is not None else 0.0 for v in values]
