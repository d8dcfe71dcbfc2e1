"""Your own model: ``module:attr`` naming an :class:`Adapter` subclass, an adapter
instance, or a plain function ``f(table: pyarrow.Table) -> mapping of columns``."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..core.errors import ModelError
from .protocol import Adapter

__all__ = ["FunctionAdapter", "add_import_paths", "load_custom"]


class FunctionAdapter(Adapter):
    """Wraps ``f(table) -> {column: values}`` as an adapter over ``input_columns``."""

    def __init__(self, fn: Callable[[pa.Table], Any], input_columns: Sequence[str]) -> None:
        self.fn = fn
        self.input_columns = tuple(input_columns)

    def predict(self, batch: pa.Table) -> Any:
        return self.fn(batch)


def add_import_paths(paths: Sequence[str]) -> None:
    """Put the driver's import ``paths`` (those that exist here) ahead of this worker process's own,
    so a ``module:attr`` model the driver imported imports here too (a Ray actor, a Spark task)."""
    for p in reversed(paths):
        if p not in sys.path and Path(p).is_dir():
            sys.path.insert(0, p)


def _user_line(exc: BaseException) -> str:
    """`` (file.py line N)``: where the user's module raised, for the one-line error."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename} line {frames[-1].lineno})" if frames else ""


def _import_attr(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    except Exception as exc:  # the module itself raised while it was imported: the user's code, named
        where = _user_line(exc)
        raised = f"{type(exc).__name__}: {exc}{where}"
        raise ModelError(f"model {spec!r}: importing {module_name!r} raised {raised}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelError(f"model {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_custom(spec: str, input_columns: Sequence[str], options: Mapping[str, Any]) -> Adapter:
    """Build the adapter ``spec`` names; ``input_columns`` comes from the job's text/feature columns."""
    obj = _import_attr(spec)
    if inspect.isclass(obj) and issubclass(obj, Adapter):
        adapter = obj(**options)
    elif isinstance(obj, Adapter):
        adapter = obj
    elif callable(obj):
        adapter = FunctionAdapter(obj, input_columns)
    else:
        raise ModelError(f"model {spec!r}: expected an Adapter subclass or a function, got {type(obj).__name__}")
    if input_columns and not adapter.input_columns:
        adapter.input_columns = tuple(input_columns)
    if not adapter.input_columns:
        raise ModelError(f"model {spec!r}: the adapter reads no column; set input_columns or --text-column")
    return adapter
