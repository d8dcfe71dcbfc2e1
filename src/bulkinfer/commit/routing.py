"""Routes: each output row goes to exactly one place, the first route whose ``when`` holds,
or the output (the ``default`` route) when none does. The expressions are parsed once
(:mod:`.expr`, never ``eval``) and evaluated vectorised over each shard's output table,
before the shard is staged, so the output's parts hold only the default route's rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from ..core.expr import Expr, mask, parse
from ..core.layout import result_columns

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["DEFAULT", "Route", "compile_routes", "split"]

DEFAULT = "default"


@dataclass(frozen=True)
class Route:
    name: str
    when: Expr
    where: str  # "route[review].when", for errors


def compile_routes(cfg: JobConfig) -> list[Route]:
    return [Route(r.name, parse(r.when, f"route[{r.name}].when"), f"route[{r.name}].when") for r in cfg.route]


def split(routes: list[Route], table: pa.Table) -> tuple[pa.Table, dict[str, pa.Table]]:
    """The rows no route takes, and each route's rows (first match wins; input order kept)."""
    rest, taken = table, {}
    for route in routes:
        hit = mask(route.when, rest.select(result_columns(rest.column_names)), route.where)
        taken[route.name] = rest.filter(hit)
        rest = rest.filter(pc.invert(hit))
    return rest, taken
