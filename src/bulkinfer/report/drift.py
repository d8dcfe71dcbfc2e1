"""How far a run's output distributions moved from an earlier run's (``--baseline``):
the population stability index (PSI) per column, class-share changes, the norm's shift and
the mean vector's cosine. Computed from the two ``stats.json`` alone (their KLL sketches and
histograms), never by reading the outputs again.

PSI = sum over bins of (current share - baseline share) * ln(current share / baseline share),
with the baseline's deciles as (right-closed) bins for numbers and norms, and the classes as bins for
labels; shares are floored at 1e-4 so an empty bin does not make it infinite. The usual
reading: under 0.1 stable, 0.1-0.25 a shift worth a look, over 0.25 a different population.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import ConfigError
from .columns import OutputStats, sketch_of, vector_of

if TYPE_CHECKING:
    from ..config import JobConfig
    from .stats import RunStats

__all__ = ["EPS", "compare_stats", "drift_against", "drift_line", "load_baseline", "psi", "psi_from_sketches"]

log = logging.getLogger("bulkinfer")

EPS = 1e-4
DECILES = [i / 10 for i in range(1, 10)]


def psi(expected: Sequence[float], actual: Sequence[float]) -> float:
    """PSI of two share vectors over the same bins."""
    e = np.maximum(np.asarray(expected, np.float64), EPS)
    a = np.maximum(np.asarray(actual, np.float64), EPS)
    return float(((a - e) * np.log(a / e)).sum())


def _shares(sk: Any, edges: list[float]) -> list[float]:
    cdf = (
        [0.0, *sk.get_cdf(edges, inclusive=True)] if edges else [0.0, 1.0]
    )  # get_cdf ends with 1.0: len(edges) + 1 bins
    return [max(0.0, hi - lo) for lo, hi in itertools.pairwise(cdf)]


def psi_from_sketches(baseline: Any, current: Any) -> float | None:
    """PSI of two KLL sketches over the baseline's deciles (None when either is empty)."""
    if baseline is None or current is None or baseline.is_empty() or current.is_empty():
        return None
    edges = sorted({float(baseline.get_quantile(q, inclusive=True)) for q in DECILES})
    return psi(_shares(baseline, edges), _shares(current, edges))


def _class_drift(base: Mapping[str, int], cur: Mapping[str, int]) -> dict[str, Any]:
    classes = sorted(set(base) | set(cur))
    nb, nc = max(sum(base.values()), 1), max(sum(cur.values()), 1)
    sb = [base.get(c, 0) / nb for c in classes]
    sc = [cur.get(c, 0) / nc for c in classes]
    return {
        "psi": round(psi(sb, sc), 6),
        "share_change": {c: round(b - a, 6) for c, a, b in zip(classes, sb, sc, strict=True)},
        "new_classes": [c for c in classes if c not in base],
        "gone_classes": [c for c in classes if c not in cur],
    }


def _mean(state: Mapping[str, Any]) -> float | None:
    m = state["moments"]
    return float(m["mean"]) if m["n"] else None


def _column_drift(base: Mapping[str, Any], cur: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = cur["kind"]
    if base["kind"] != kind:
        return None
    if kind == "label" and base.get("classes") is not None and cur.get("classes") is not None:
        return {"kind": kind, **_class_drift(base["classes"], cur["classes"])}
    key = "norm" if kind == "vector" else "values"
    if key not in base or key not in cur:
        return None
    value = psi_from_sketches(sketch_of(base[key]), sketch_of(cur[key]))
    out: dict[str, Any] = {"kind": kind, "psi": None if value is None else round(value, 6)}
    mb, mc = _mean(base[key]), _mean(cur[key])
    out["norm_shift" if kind == "vector" else "mean_shift"] = None if mb is None or mc is None else round(mc - mb, 6)
    if kind == "vector" and base.get("sum") and cur.get("sum") and base["dim"] == cur["dim"]:
        a, b = vector_of(base["sum"]), vector_of(cur["sum"])
        denom = float(np.linalg.norm(a) * np.linalg.norm(b))
        out["mean_vector_cosine"] = round(float(a @ b) / denom, 6) if denom else None
    return out


def compare_stats(baseline: OutputStats, current: OutputStats, max_psi: float) -> dict[str, Any]:
    """Per shared column: PSI and shifts; ``status`` is ``drift`` when a PSI is over ``max_psi``."""
    columns: dict[str, Any] = {}
    for name in sorted(set(baseline.columns) & set(current.columns)):
        d = _column_drift(baseline.columns[name], current.columns[name])
        if d is not None:
            columns[name] = d
    over = sorted(n for n, d in columns.items() if d.get("psi") is not None and d["psi"] > max_psi)
    worst = max((d["psi"] for d in columns.values() if d.get("psi") is not None), default=None)
    return {
        "status": "drift" if over else "ok",
        "max_psi": max_psi,
        "worst_psi": None if worst is None or math.isnan(worst) else worst,
        "over": over,
        "columns": columns,
        "only_in_baseline": sorted(set(baseline.columns) - set(current.columns)),
        "only_in_current": sorted(set(current.columns) - set(baseline.columns)),
    }


def load_baseline(where: str | None) -> OutputStats | None:
    """The column statistics of ``monitor.baseline`` (checked before any inference)."""
    if where is None:
        return None
    from ..core.layout import PRIVATE, STATS
    from ..core.storage import read_whole

    data = read_whole(f"{where.rstrip('/')}/{PRIVATE}/{STATS}")
    if data is None:
        raise ConfigError(
            f"monitor.baseline: {where} has no {PRIVATE}/{STATS} (not a bulkinfer output, or written before "
            "bulkinfer kept statistics); point it at an earlier run's output or rerun that job"
        )
    return OutputStats.from_json(json.loads(data))


def drift_against(baseline: OutputStats, stats: RunStats, cfg: JobConfig) -> dict[str, Any]:
    """This run's drift against the baseline, with a warning line when a column drifted."""
    drift = compare_stats(baseline, stats.output, cfg.monitor.max_psi)
    if drift["status"] == "drift":
        log.warning("drift against %s: %s", cfg.monitor.baseline, drift_line(drift))
    return drift


def drift_line(drift: dict[str, Any]) -> str:
    """The drifted columns and their PSI, in one line."""
    cols = drift["columns"]
    figures = ", ".join(f"{n} PSI {cols[n]['psi']:.3f}" for n in drift["over"])
    return f"{figures} (over monitor.max_psi={drift['max_psi']})"
