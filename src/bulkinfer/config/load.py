"""Reading a job: TOML, flags and ``--set key=value`` into one validated :class:`JobConfig`, with
one-line errors; and every field's documentation (:func:`field_docs`)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..core.credentials import find_masked
from ..core.errors import ConfigError
from .ensemble import DecisionConfig, MemberConfig
from .exports import (
    EXPORT_KINDS,
    RouteConfig,
)
from .job import JobConfig
from .model import ModelConfig
from .moderation import CategoryConfig, ModerationConfig


def _format_validation_error(exc: ValidationError, origin: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field (see `bulkinfer run --help` for the fields)"
    elif "input" in err and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{origin}: {loc}: {msg}{more}"


def toml_value(value: Any) -> str:
    """``value`` as a TOML value for ``--set`` (a string stays a string even when it looks like a number)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: these escapes are TOML's too
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"override value {value!r}: use a string, number, boolean, list or table")


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value as a TOML value, falling back to a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` (dotted) to ``value``; a table merges into the table already there (a flag
    and a ``--set`` of the same table both count), anything else replaces what is there."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a section")
        node = child
    here = node.get(parts[-1])
    if isinstance(value, dict) and isinstance(here, dict):
        for name, inner in value.items():
            _set_dotted(here, name, inner)
    else:
        node[parts[-1]] = value


def _leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """The dotted leaves a value sets: a table's own fields, recursively."""
    if isinstance(value, dict) and value:
        for name, inner in value.items():
            yield from _leaves(f"{key}.{name}", inner)
    else:
        yield key, value


def _check_agrees(flags: Mapping[str, Any], key: str, value: Any) -> None:
    """A ``--set`` may add to what a flag set, never silently contradict it."""
    for leaf, given in _leaves(key, value):
        for flag, said in flags.items():
            if said is not None and (leaf == flag or leaf.startswith(flag + ".")) and said != given:
                raise ConfigError(f"{leaf}: a flag sets {said!r} and --set {key} sets {given!r}; give it once")


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    sets: list[str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> JobConfig:
    """Build a :class:`JobConfig` from ``base`` or a TOML file, then dotted-key overrides, then ``k=v`` strings."""
    data: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (base or {}).items()}
    origin = "config"
    if path is not None:
        origin = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"{path}: config file not found") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set runtime.batch_size=64")
        value = parse_value(raw.strip())
        _check_agrees(overrides or {}, key.strip(), value)
        _set_dotted(data, key.strip(), value)
    if base is not None and path is None and (masked := find_masked(data)) is not None:
        raise ConfigError(
            f"{masked}: the output's job.json keeps no credentials; rerun with the job file that holds it (-c)"
        )
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, origin)) from exc


def _doc(field: Any) -> str:
    return " ".join((field.description or "").split())


def _export_docs() -> Iterator[tuple[str, str, str]]:
    kinds = ", ".join(t.model_fields["kind"].default for t in EXPORT_KINDS)
    yield "export.kind", "(required)", f"Which target this [[export]] table is: {kinds}; its fields follow."
    for target in EXPORT_KINDS:
        kind = target.model_fields["kind"].default
        for name, field in target.model_fields.items():
            if name != "kind":
                yield f"export.{name}", repr(field.get_default(call_default_factory=True)), f"({kind}) {_doc(field)}"


def _route_docs() -> Iterator[tuple[str, str, str]]:
    for name, field in RouteConfig.model_fields.items():
        yield f"route.{name}", "[]" if name == "export" else "(required)", _doc(field)


def _models_docs() -> Iterator[tuple[str, str, str]]:
    yield "models.<name>", "{}", _doc(JobConfig.model_fields["models"])
    for name in [n for n in MemberConfig.model_fields if n not in ModelConfig.model_fields]:
        yield f"models.<name>.{name}", "None", _doc(MemberConfig.model_fields[name])


def _moderation_docs() -> Iterator[tuple[str, str, str]]:
    yield "moderation.categories", "{}", _doc(ModerationConfig.model_fields["categories"])
    for name in ("score", "threshold"):
        field = CategoryConfig.model_fields[name]
        yield f"moderation.categories.{name}", repr(field.get_default()), _doc(field)
    for name in ("text_column", "image_column"):
        field = ModerationConfig.model_fields[name]
        yield f"moderation.{name}", repr(field.get_default()), _doc(field)


_NESTED = {"export": _export_docs, "route": _route_docs, "models": _models_docs, "moderation": _moderation_docs}
"""Sections that are lists or tables of tables: documented by field, once."""


def field_docs() -> Iterator[tuple[str, str, str]]:
    """Yield (dotted name, default, doc) for every leaf field, for help texts and the README."""
    for section, info in JobConfig.model_fields.items():
        if section in _NESTED:
            yield from _NESTED[section]()
            continue
        model = DecisionConfig if section == "decision" else info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            yield f"{section}.{name}", repr(field.get_default(call_default_factory=True)), _doc(field)
