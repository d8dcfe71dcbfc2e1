"""The run's counters and timings, fed by the runner and the committer (thread-safe)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .columns import OutputStats

__all__ = ["STAGES", "RunStats"]

STAGES = ("read", "preprocess", "infer", "write")
TIMELINE_POINTS = 2000


def _bucket(n: int) -> str:
    """Power-of-two bucket label of a batch size: 1, 2, 3-4, 5-8, ..."""
    hi = 1
    while hi < n:
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1
    return str(hi) if lo == hi else f"{lo}-{hi}"


@dataclass
class RunStats:
    """Thread-safe counters of one run."""

    rows_planned: int = 0
    rows_already_done: int = 0
    rows_in: int = 0
    rows_out: int = 0
    rows_inferred: int = 0
    rows_failed: int = 0
    rows_reused: int = 0  # results taken from the previous output (incremental)
    rows_deduplicated: int = 0  # results copied from an identical row (dedupe)
    rows_from_gate: int = 0  # results the quality gate computed on its sample rows
    rows_truncated: int = 0  # texts cut to the model's token limit (model.truncate)
    shards_planned: int = 0
    shards_already_done: int = 0
    shards_committed: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    prompt_tokens: int = 0  # generation: the prompts' tokens of the rows answered this run
    completion_tokens: int = 0  # generation: the tokens generated for them
    stage_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    wait_for_input_s: float = 0.0
    commit_s: float = 0.0  # this process's time committing shards (publish, ledger line, figures)
    setup_split: dict[str, float] = field(default_factory=dict)  # the model's set-up, the gate (local runner)
    first_commit_s: float | None = None  # seconds from the start to the first committed row
    batch_sizes: Counter[int] = field(default_factory=Counter)
    quality: dict[str, Any] | None = None
    backend: dict[str, Any] | None = None  # the Ray runner's workers, splits, re-queued and discarded attempts
    exports: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> rows, seconds
    routes: dict[str, int] = field(default_factory=dict)  # route -> rows this run ("default": the output's)
    output: OutputStats = field(default_factory=OutputStats)  # column statistics of every part in force
    drift: dict[str, Any] | None = None  # against monitor.baseline (report.drift.compare_stats)
    remote_batches: dict[str, int] = field(default_factory=dict)  # a remote Batch API's batches by status
    dedupe: bool | str | None = None  # runtime.dedupe as it ran (auto: what the runner decided)
    empty_inputs: list[str] = field(default_factory=list)  # input files of 0 bytes (a truncated upload?)
    models: dict[str, dict[str, float]] = field(default_factory=dict)  # several models: seconds, rows, failed each
    pictures_decoded: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, rows out) per commit
    started: float = field(default_factory=time.perf_counter)
    running_since: float | None = None
    finished: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_time(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.stage_s[stage] += seconds

    def add_batch(self, rows: int, tokens: int = 0, padded: int = 0) -> None:
        with self._lock:
            self.batch_sizes[rows] += 1
            self.tokens += tokens
            self.padded_tokens += padded

    def add_generated(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens

    def add_rows(self, *, rows_in: int = 0, rows_out: int = 0, failed: int = 0, shards: int = 0) -> None:
        with self._lock:
            self.rows_in += rows_in
            self.rows_out += rows_out
            self.rows_failed += failed
            self.shards_committed += shards
            self.timeline.append((round(time.perf_counter() - self.started, 3), self.rows_out))
            if self.first_commit_s is None and self.rows_out:
                self.first_commit_s = self.timeline[-1][0]
            if len(self.timeline) > TIMELINE_POINTS:  # keep it bounded: every other point, the last one kept
                self.timeline = self.timeline[-1::-2][::-1]

    def add_reuse(self, previous: int = 0, deduplicated: int = 0, gate: int = 0) -> None:
        with self._lock:
            self.rows_reused += previous
            self.rows_deduplicated += deduplicated
            self.rows_from_gate += gate

    def add_truncated(self, rows: int) -> None:
        if rows:
            with self._lock:
                self.rows_truncated += rows

    def add_figures(self, figures: Mapping[str, Any]) -> None:
        """What an adapter measured (``Adapter.take_figures``): several models' own figures, pictures decoded."""
        if not figures:
            return
        with self._lock:
            self.pictures_decoded += int(figures.get("pictures_decoded", 0))
            for name, own in (figures.get("models") or {}).items():
                mine = self.models.setdefault(name, {"seconds": 0.0, "rows": 0, "failed": 0})
                for key in mine:
                    mine[key] += own.get(key, 0)

    def add_route(self, route: str, rows: int) -> None:
        with self._lock:
            self.routes[route] = self.routes.get(route, 0) + rows

    def add_export(self, target: str, rows: int, seconds: float) -> None:
        with self._lock:
            figures = self.exports.setdefault(target, {"rows": 0, "seconds": 0.0})
            figures["rows"] += rows
            figures["seconds"] += seconds

    def worker_figures(self) -> dict[str, Any]:
        """The counters a Ray worker measures, to be merged into the driver's with :meth:`merge`."""
        with self._lock:
            return {
                "stage_s": dict(self.stage_s),
                "wait_for_input_s": self.wait_for_input_s,
                "rows_inferred": self.rows_inferred,
                "tokens": self.tokens,
                "padded_tokens": self.padded_tokens,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "batch_sizes": dict(self.batch_sizes),
                "rows_reused": self.rows_reused,
                "rows_deduplicated": self.rows_deduplicated,
                "rows_truncated": self.rows_truncated,
                "adapter": {"models": dict(self.models), "pictures_decoded": self.pictures_decoded},
            }

    def merge(self, figures: dict[str, Any]) -> None:
        with self._lock:
            for stage, seconds in figures["stage_s"].items():
                self.stage_s[stage] = self.stage_s.get(stage, 0.0) + seconds
            self.wait_for_input_s += figures["wait_for_input_s"]
            self.rows_inferred += figures["rows_inferred"]
            self.tokens += figures["tokens"]
            self.padded_tokens += figures["padded_tokens"]
            self.prompt_tokens += figures.get("prompt_tokens", 0)
            self.completion_tokens += figures.get("completion_tokens", 0)
            self.batch_sizes.update({int(k): v for k, v in figures["batch_sizes"].items()})
            self.rows_reused += figures.get("rows_reused", 0)
            self.rows_deduplicated += figures.get("rows_deduplicated", 0)
            self.rows_truncated += figures.get("rows_truncated", 0)
        self.add_figures(figures.get("adapter") or {})

    def remote_line(self) -> str:
        """A remote Batch API's batches by status ("2 in_progress, 1 completed"; "" for a local model)."""
        return ", ".join(f"{n} {status}" for status, n in sorted(self.remote_batches.items()))

    def _setup_split(self) -> dict[str, float | None]:
        """Where the set-up went, each part timed where it ran: planning (``plan_s``), the model's
        export and int8 build when they were not cached (``export_s``, ``build_s``), its load
        (``load_s``), the quality gate (``gate_s``); the rest of the set-up, not timed on its own
        (settling the config, opening the output and its targets: ``other_s``); and seconds from
        the start to the first committed row (``first_commit_s``)."""
        parts = {k: round(v, 3) for k, v in self.setup_split.items()}
        other = max(self.wall_s - self.run_s - sum(self.setup_split.values()), 0.0)
        return {**parts, "other_s": round(other, 3), "first_commit_s": self.first_commit_s}

    def mark_running(self) -> None:
        """The model is set up: throughput is measured from here."""
        self.running_since = time.perf_counter()

    @property
    def wall_s(self) -> float:
        return (self.finished or time.perf_counter()) - self.started

    @property
    def run_s(self) -> float:
        """Seconds since set-up finished (the processing time that rows/s is computed over)."""
        return (self.finished or time.perf_counter()) - (self.running_since or self.started)

    def to_json(
        self, *, price_per_hour: float = 0.0, currency: str = "USD", token_prices: tuple[float, float] = (0.0, 0.0)
    ) -> dict[str, Any]:
        """The run's figures; ``token_prices``: a remote model's price per million input and
        output tokens, booked with the instance's time."""
        wall = max(self.run_s, 1e-9)
        return {
            "rows_planned": self.rows_planned,
            "rows_already_done": self.rows_already_done,
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "rows_failed": self.rows_failed,
            "rows_truncated": self.rows_truncated,
            "shards": {
                "planned": self.shards_planned,
                "already_done": self.shards_already_done,
                "committed": self.shards_committed,
            },
            "wall_s": round(self.wall_s, 3),
            "setup_s": round(self.wall_s - self.run_s, 3),
            **({"setup_split": self._setup_split()} if self.setup_split else {}),
            "run_s": round(wall, 3),
            "rows_per_s": round(self.rows_inferred / wall, 2),  # the headline: rows the model ran, per second
            "rows_written_per_s": round(self.rows_out / wall, 2),  # with the rows reused (gate, dedupe, previous)
            "time_s": {k: round(v, 3) for k, v in self.stage_s.items()},
            "time_share": {k: round(v / wall, 4) for k, v in self.stage_s.items()},
            "wait_for_input_s": round(self.wait_for_input_s, 3),
            "commit": {
                "s": round(self.commit_s, 3),
                "shards_per_s": round(self.shards_committed / self.commit_s, 1) if self.commit_s else None,
            },
            "batches": self._batches(),
            "quality": self.quality,
            **self._if_any(),
            "reuse": {
                "rows_from_previous": self.rows_reused,
                "rows_deduplicated": self.rows_deduplicated,
                "rows_from_gate": self.rows_from_gate,
                "rows_inferred": self.rows_inferred,
                "dedupe": self.dedupe,
            },
            "timeline": [[0.0, 0], *([t, n] for t, n in self.timeline)],
            **self._exports(wall),
            "cost": self._cost(price_per_hour, currency, token_prices),
            **self._tokens(wall),
        }

    def _batches(self) -> dict[str, Any]:
        n_batches = sum(self.batch_sizes.values())
        hist: Counter[str] = Counter()
        for size, count in sorted(self.batch_sizes.items()):
            hist[_bucket(size)] += count
        return {
            "count": n_batches,
            "mean_rows": round(sum(k * v for k, v in self.batch_sizes.items()) / max(n_batches, 1), 2),
            "histogram": dict(hist),
            "padding_ratio": round(self.padded_tokens / self.tokens, 4) if self.tokens else None,
        }

    def _if_any(self) -> dict[str, Any]:
        """The sections only some runs have (a cluster backend, routes, drift, empty inputs, remote batches)."""
        sections = {
            "backend": self.backend,
            "routes": dict(self.routes),
            "drift": self.drift,
            "empty_inputs": list(self.empty_inputs),
            "remote_batches": dict(self.remote_batches),
            "pictures_decoded": self.pictures_decoded,
            "models": self._models(),
        }
        return {k: v for k, v in sections.items() if v}

    def _models(self) -> dict[str, dict[str, Any]]:
        """Several models: each one's seconds, busy share of the run, rows and failed rows."""
        wall = max(self.run_s, 1e-9)
        return {
            name: {"seconds": round(f["seconds"], 3), "share": round(f["seconds"] / wall, 4),
                   "rows": int(f["rows"]), "failed": int(f["failed"])}
            for name, f in self.models.items()
        }  # fmt: skip

    def _exports(self, wall: float) -> dict[str, Any]:
        if not self.exports:
            return {}
        return {
            "exports": {
                name: {
                    "rows": int(f["rows"]),
                    "seconds": round(f["seconds"], 3),
                    "share": round(f["seconds"] / wall, 4),
                }
                for name, f in self.exports.items()
            }
        }

    def _cost(self, price_per_hour: float, currency: str, token_prices: tuple[float, float]) -> dict[str, Any]:
        token_cost = (self.prompt_tokens * token_prices[0] + self.completion_tokens * token_prices[1]) / 1e6
        cost_run = price_per_hour * self.wall_s / 3600.0 + token_cost
        return {
            "instance_price_per_hour": price_per_hour,
            "currency": currency,
            "run": round(cost_run, 6),
            **({"remote_tokens": round(token_cost, 6)} if any(token_prices) else {}),
            "per_million_rows": round(cost_run / self.rows_out * 1e6, 4) if self.rows_out else None,
            **self._token_costs(cost_run),
        }

    def _tokens(self, wall: float) -> dict[str, Any]:
        """Generation: tokens in and out this run, and the rate they were generated at."""
        if not (self.prompt_tokens or self.completion_tokens):
            return {}
        return {
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "completion_per_s": round(self.completion_tokens / wall, 2),
                "total_per_s": round((self.prompt_tokens + self.completion_tokens) / wall, 2),
            }
        }

    def _token_costs(self, cost_run: float) -> dict[str, Any]:
        total = self.prompt_tokens + self.completion_tokens
        if not total:
            return {}
        per_completion = cost_run / self.completion_tokens * 1e6 if self.completion_tokens else None
        return {
            "per_million_tokens": round(cost_run / total * 1e6, 6),
            "per_million_completion_tokens": None if per_completion is None else round(per_completion, 6),
        }
