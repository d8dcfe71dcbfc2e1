"""Several models over one input (``[models.<name>]``): a small DAG run as one adapter.

Each model's columns come out as ``<name>.<column>``; a model may read another's
(``text_column = "ocr.text"``), so the models run in an order where every input exists
(:func:`member_order` refuses a cycle or an input nobody writes before any row runs).
Pictures are read and decoded once for every picture model that reads them: the shared
decode pool hands each decoded picture to each model's own ``prepare`` (resize, normalise).

A model that fails on a row fails it for itself and the models that read its columns; the
row keeps every other model's columns and says which model failed in ``<name>.error``. The
``decision`` rules (:mod:`bulkinfer.config.ensemble`) run last, over every model's columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..config import JobConfig
from ..config.ensemble import DecisionConfig
from ..core.batching import bisect_call
from ..core.errors import BulkinferError, ConfigError
from ..core.expr import Expr, columns, mask, parse, resolve_column
from .decode import BadImage, DecodePool
from .image import ImageAdapter
from .protocol import Adapter, RowsRejected, SetupContext, predict_features

__all__ = ["DECISION", "Ensemble", "Member", "member_config", "member_order"]

DECISION = "decision"
"""The column the decision rules write."""


@dataclass
class Member:
    """One model of the job: its name (its columns' prefix), its adapter and its batch size."""

    name: str
    adapter: Adapter
    batch_size: int
    reads: list[str] = field(default_factory=list)
    """The members whose columns it reads."""

    @property
    def pictures(self) -> bool:
        """Decoded by the shared pool: a picture model reading an input column."""
        return isinstance(self.adapter, ImageAdapter) and not self.reads


def member_config(cfg: JobConfig, name: str) -> JobConfig:
    """``cfg`` as the job of model ``name`` alone: its fields as ``[model]``, its batch size,
    engine and precision over the job's ``[runtime]``."""
    member = cfg.models[name]
    own = {k: v for k in ("batch_size", "engine", "precision") if (v := getattr(member, k)) is not None}
    if own.get("precision", "fp32") != "fp32":
        raise ConfigError(
            f"models.{name}.precision = {own['precision']}: a several-model job runs each model in fp32 "
            "(the quality gate judges one model at a time); drop it, or run this model as a job of its own"
        )
    model = cfg.model.model_validate(member.model_dump(exclude={"batch_size", "engine", "precision"}))
    runtime = cfg.runtime.model_copy(update={"precision": "fp32", **own})
    # a batch file's requests are read by the models together (moderations), each model reads rows
    source = cfg.source.model_copy(update={"format": "auto"}) if cfg.source.format == "openai-batch" else cfg.source
    return cfg.model_copy(update={"model": model, "runtime": runtime, "source": source, "models": {},
                                  "decision": None, "moderation": None})  # fmt: skip


def member_order(members: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The models in an order where each runs after the models whose columns it reads
    (``members``: name -> input columns), each with those models; a cycle is refused, naming
    its models."""
    reads = {n: sorted({c.split(".", 1)[0] for c in cols if "." in c and c.split(".", 1)[0] in members})
             for n, cols in members.items()}  # fmt: skip
    for name, upstream in reads.items():
        if name in upstream:
            raise ConfigError(f"models.{name}: reads its own columns ({name}.*); a model reads its input or others'")
    order: list[str] = []
    while len(order) < len(members):
        ready = [n for n in members if n not in order and all(u in order for u in reads[n])]
        if not ready:
            stuck = [n for n in members if n not in order]
            raise ConfigError(f"models: {', '.join(stuck)} read each other's columns in a cycle; break it")
        order.extend(ready)
    return {n: reads[n] for n in order}


def _refuse_unwritten(col: str, members: Sequence[Member], where: str) -> None:
    """``col`` is ``<model>.<column>`` of a model that declares its columns and does not write it:
    refused, naming what it writes (a name without a model's prefix is an input column)."""
    owner, _, rest = col.partition(".")
    known = next((m.adapter.output_columns for m in members if m.name == owner), None)
    if known is not None and rest and resolve_column(rest, known) is None:
        raise ConfigError(
            f"{where}: reads {col!r}, which model {owner!r} does not write "
            f"(it writes {', '.join(f'{owner}.{c}' for c in known)})"
        )


def check_reads(members: Sequence[Member]) -> None:
    """A model reading a column of a model that declares its columns and does not write it:
    refused, naming both."""
    for m in members:
        for col in m.adapter.input_columns:
            _refuse_unwritten(col, members, f"models.{m.name}")


@dataclass(frozen=True)
class Rule:
    outcome: str
    when: Expr


def check_columns(expr: Expr, members: Sequence[Member], where: str) -> None:
    """An expression over a model's column that model (declaring its columns) does not write: refused."""
    for col in columns(expr):
        _refuse_unwritten(col, members, where)


def compile_decision(decision: DecisionConfig, members: Sequence[Member]) -> list[Rule]:
    """The decision's rules, parsed; a rule over a model's column that model does not write is refused."""
    rules = [Rule(o, parse(w, f"decision.rules.{o}")) for o, w in decision.rules.items()]
    for rule in rules:
        check_columns(rule.when, members, f"decision.rules.{rule.outcome}")
    return rules


def input_kinds(members: Sequence[Member]) -> dict[str, set[str]]:
    """What each model reads, in the end: pictures (a picture model, or a model reading one's
    columns: OCR's text) or text."""
    kinds: dict[str, set[str]] = {}
    for m in members:  # in their order: a reader after the models it reads
        kinds[m.name] = {"image"} if m.pictures else set().union(*(kinds[u] for u in m.reads)) if m.reads else {"text"}
    return kinds


@dataclass
class Features:
    """A window's rows as the ensemble holds them: the input table and, for each picture
    model, what its ``prepare`` made of each row's decoded picture."""

    table: pa.Table
    pictures: dict[str, list[Any]]

    def __len__(self) -> int:
        return int(self.table.num_rows)


@dataclass
class _Figures:
    seconds: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, seconds: float, rows: int, failed: int) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.rows[name] = self.rows.get(name, 0) + rows
        self.failed[name] = self.failed.get(name, 0) + failed


class Ensemble(Adapter):
    """The models of a job as one adapter (see the module)."""

    def __init__(
        self,
        members: Sequence[Member],
        options: Mapping[str, Mapping[str, Any]],
        decision: DecisionConfig | None = None,
    ) -> None:
        self.members = list(members)
        self.options = options
        check_reads(self.members)
        names = {m.name for m in self.members}
        self.input_columns = list(dict.fromkeys(
            c for m in self.members for c in m.adapter.input_columns if c.split(".", 1)[0] not in names
        ))  # fmt: skip
        self.decision = decision
        self.rules = compile_decision(decision, self.members) if decision is not None else []
        self.batch_size_hint = max(m.batch_size for m in self.members)
        """The rows of one call: each model cuts them into its own batches."""
        hints = [m.adapter.window_rows for m in self.members if m.adapter.window_rows]
        self.window_rows = min(hints) if hints else None
        self.output_columns = self._outputs()
        columns = {m.adapter.picture_column for m in self.members if m.adapter.picture_column}
        self.picture_column = columns.pop() if len(columns) == 1 else None
        self.pool: DecodePool | None = None
        self._figures = _Figures()

    def _outputs(self) -> list[str] | None:
        out: list[str] = []
        for m in self.members:
            if m.adapter.output_columns is None:
                return None
            out += [f"{m.name}.{c}" for c in m.adapter.output_columns] + [f"{m.name}.error"]
        return out + ([DECISION] if self.decision is not None else [])

    def setup(self, ctx: SetupContext) -> None:
        pictures = [m for m in self.members if m.pictures]
        if pictures:
            first = pictures[0].adapter
            assert isinstance(first, ImageAdapter)
            if any(m.adapter.decode != "exact" for m in pictures if isinstance(m.adapter, ImageAdapter)):
                raise ConfigError('source.decode = "reduced": several picture models share one decode; use "exact"')
            self.pool = DecodePool(ctx.threads, first.max_pixels, first.max_decoded_mb << 20)
        for m in self.members:
            own = SetupContext(ctx.threads, ctx.device, self.options.get(m.name, {}), ctx.online)
            if m.pictures:
                assert isinstance(m.adapter, ImageAdapter)
                m.adapter.load(own)  # its pictures come from the shared pool
            else:
                m.adapter.setup(own)

    def preprocess(self, table: pa.Table) -> Features:
        """Each picture column read and decoded once, handed to every picture model reading it."""
        groups: dict[str, list[Member]] = {}
        for m in self.members:
            if m.pictures:
                assert isinstance(m.adapter, ImageAdapter)
                groups.setdefault(m.adapter.image_column, []).append(m)
        pictures: dict[str, list[Any]] = {}
        for group in groups.values():
            first = group[0].adapter
            assert isinstance(first, ImageAdapter) and self.pool is not None
            values, names = first.picture_inputs(table)
            given = np.flatnonzero(~_absent(table, [first.image_column]))  # a row without a picture: none to decode
            decoded = self.pool.run([values[i] for i in given], [names[i] for i in given], _prepare_all(group))
            done: list[Any] = [None] * len(values)
            for i, result in zip(given, decoded, strict=True):
                done[i] = result
            bad = {i: r for i, r in enumerate(done) if isinstance(r, BadImage)}
            if bad:
                raise RowsRejected(bad)
            for j, m in enumerate(group):
                pictures[m.name] = [None if r is None else r[j] for r in done]
        return Features(table, pictures)

    def select(self, features: Any, indices: np.ndarray) -> Any:
        if not isinstance(features, Features):
            return super().select(features, indices)
        rows = pa.array(indices, type=pa.int64())
        return Features(features.table.take(rows), {k: [v[i] for i in indices] for k, v in features.pictures.items()})

    def predict(self, batch: Features) -> dict[str, pa.Array]:
        n = batch.table.num_rows
        work = batch.table
        failed: dict[str, dict[int, str]] = {}
        out: dict[str, pa.Array] = {}
        for m in self.members:
            skipped = {i: f"skipped: model {u!r} failed on the row" for u in m.reads for i in failed[u]}
            absent = _absent(work, m.adapter.input_columns)  # no input: the model does not run on the row
            alive = np.array([i for i in range(n) if i not in skipped and not absent[i]], dtype=np.int64)
            t0 = time.perf_counter()
            rows, cols, errors = self._run(m, batch, work, alive)
            self._figures.add(m.name, time.perf_counter() - t0, len(alive), len(errors))
            failed[m.name] = {**skipped, **errors}
            if not cols and m.adapter.output_columns is not None:  # no row answered: its columns, empty
                cols = {c: pa.nulls(0) for c in m.adapter.output_columns}
            for name, col in cols.items():
                full = _scatter(col, rows, n)
                out[f"{m.name}.{name}"] = full
                work = work.append_column(f"{m.name}.{name}", full)
            out[f"{m.name}.error"] = pa.array([failed[m.name].get(i) for i in range(n)], pa.string())
        if self.decision is not None:
            any_failed = np.zeros(n, dtype=bool)
            for errs in failed.values():
                any_failed[list(errs)] = True
            out[DECISION] = self._decide(work, any_failed)
        return out

    def _run(
        self, m: Member, batch: Features, work: pa.Table, alive: np.ndarray
    ) -> tuple[np.ndarray, dict[str, pa.Array], dict[int, str]]:
        """Model ``m`` over the rows ``alive``: the rows it answered, its columns for them, and
        the error of each row it failed on (a row's failure found by halving the call)."""
        if not len(alive):
            return alive, {}, {}
        errors: dict[int, str] = {}
        if m.pictures:
            features: Any = [batch.pictures[m.name][i] for i in alive]
        else:  # its input columns and the kept ones, as a job of its own would read
            kept = [c for c in batch.table.column_names if c not in self.input_columns]
            own = work.select(list(dict.fromkeys([*m.adapter.input_columns, *kept])))
            alive, features, errors = _preprocess(m, own, alive)
            if not len(alive):
                return alive, {}, errors

        def call(part: np.ndarray) -> dict[str, pa.Array]:
            return predict_features(m.adapter, m.adapter.select(features, part), len(part), m.batch_size)

        everything = np.arange(len(alive))
        failures: list[tuple[int, BaseException]] = []
        try:
            pieces = [(everything, call(everything))]
        except BulkinferError:
            raise
        except Exception:
            pieces, failures = bisect_call(everything, call, known_bad=True)
        errors.update({int(alive[i]): f"model {m.name!r}: {type(e).__name__}: {e}" for i, e in failures})
        if not pieces:
            return np.empty(0, dtype=np.int64), {}, errors
        at = np.concatenate([p[0] for p in pieces])
        order = pa.array(np.argsort(at, kind="stable"))
        cols = {c: pa.concat_arrays([p[1][c] for p in pieces]).take(order) for c in pieces[0][1]}
        return alive[np.sort(at)], cols, errors

    def _decide(self, work: pa.Table, any_failed: np.ndarray) -> pa.Array:
        """The first rule that holds names the row's decision; none holding: the default, or
        ``on_error`` where a model failed on the row (no row is published on a missing score)."""
        assert self.decision is not None
        fallback = np.where(any_failed, self.decision.on_error, self.decision.default).astype(object)
        if not self.rules:
            return pa.array(fallback.tolist(), pa.string())
        hits = [mask(r.when, work, f"decision.rules.{r.outcome}").to_numpy(zero_copy_only=False) for r in self.rules]
        chosen = np.select(hits, [np.full(len(fallback), r.outcome, dtype=object) for r in self.rules], fallback)
        return pa.array(chosen.tolist(), pa.string())

    def take_figures(self) -> dict[str, Any]:
        figures, self._figures = self._figures, _Figures()
        models = {n: {"seconds": figures.seconds[n], "rows": figures.rows[n], "failed": figures.failed[n]}
                  for n in figures.seconds}  # fmt: skip
        return {"models": models, "pictures_decoded": self.pool.take_decoded() if self.pool is not None else 0}

    def close(self) -> None:
        for m in self.members:
            m.adapter.close()
        if self.pool is not None:
            self.pool.close()


def _preprocess(m: Member, work: pa.Table, alive: np.ndarray) -> tuple[np.ndarray, Any, dict[int, str]]:
    """Model ``m``'s features for the rows ``alive`` (its input may be another model's column);
    rows its preprocessing rejects fail for it alone."""
    errors: dict[int, str] = {}
    while len(alive):
        try:
            return alive, m.adapter.preprocess(work.take(pa.array(alive))), errors
        except RowsRejected as rejected:
            errors.update({int(alive[i]): f"model {m.name!r}: {e}" for i, e in rejected.errors.items()})
            alive = np.delete(alive, list(rejected.errors))
    return alive, None, errors


def _absent(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """The rows where any of ``columns`` (those the table has) is null."""
    out = np.zeros(table.num_rows, dtype=bool)
    for c in columns:
        if c in table.column_names:
            out |= table.column(c).is_null().to_numpy(zero_copy_only=False)
    return out


def _prepare_all(members: Sequence[Member]) -> Callable[[np.ndarray], tuple[Any, ...]]:
    """One decoded picture as each picture model prepares it (resized, normalised, its own way)."""
    prepares = [m.adapter.prepare for m in members if isinstance(m.adapter, ImageAdapter)]
    return lambda image: tuple(p(image) for p in prepares)


def _scatter(col: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """``col`` (one value per row of ``rows``) spread over ``n`` rows, null elsewhere."""
    at = np.full(n, -1, dtype=np.int64)
    at[rows] = np.arange(len(rows))
    return col.take(pa.array(at, mask=at < 0))
