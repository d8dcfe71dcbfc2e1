"""The quality gate: a lowered precision must stay close to fp32 on the job's own rows.

Before a job runs in bf16 or int8, ``runtime.quality_sample_rows`` rows from across its
input (:func:`sample_rows`) go through the job's adapter and through the same model in fp32; embeddings are
compared by cosine (mean and minimum per row) and by how many of each row's 10 nearest
neighbours stay the same. Below ``runtime.quality_floor`` (mean cosine) the job refuses,
with the figures, before writing anything. The figures go into ``report.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .._version import __version__
from ..adapters import Adapter, SetupContext, build_adapter, predict_table, to_numpy_column
from ..core.errors import QualityGateError
from ..core.hardware import available_cpus, int8_scheme, isa_key
from ..engines import default_cache_dir
from ..sources import ROW, Shard, read_shard
from .detections import compare_detections

if TYPE_CHECKING:
    from ..adapters import ResolvedModel
    from ..commit.ledger import OutputLedger
    from ..config import JobConfig

    # computes the gate's figures (raising QualityGateError below the floor): gate_figures here,
    # or the same on a cluster node that has the job's device (the Ray runner)
    GateFigures = Callable[[JobConfig, Adapter, ResolvedModel, Sequence[Shard]], dict[str, Any]]

__all__ = [
    "GateRows",
    "GateVerdict",
    "compare_embeddings",
    "job_quality_gate",
    "partial_int8",
    "quality_gate",
    "run_adapter",
    "sample_figures",
    "sample_shards",
    "searchable",
]

log = logging.getLogger("bulkinfer")


@dataclass(frozen=True)
class GateRows:
    """The gate's sample rows (the model's input columns) and the results the job's own build
    gave them: output rows already computed, which the run takes instead of inferring them again."""

    inputs: pa.Table
    outputs: dict[str, pa.Array]


@dataclass(frozen=True)
class GateVerdict:
    """What the quality gate decided: its figures (None: no gate, fp32) and, when this process
    computed them, the sample rows with the job's own results (:class:`GateRows`). A runner's
    ``start`` returns it; a cluster driver builds its workers' config from the figures
    (:func:`bulkinfer.precision.settle.after_gate`) and the job reports them, each once."""

    figures: dict[str, Any] | None = None
    rows: GateRows | None = None


def sample_shards(shards: Sequence[Shard], spread: int = 16) -> list[Shard]:
    """The shards :func:`sample_rows` reads: up to ``spread``, spaced evenly through the plan (all
    a gate on another process needs to be sent, not the plan's million)."""
    k = min(spread, len(shards))
    return [shards[i] for i in sorted({round(i * (len(shards) - 1) / max(1, k - 1)) for i in range(k)})]


def sample_rows(shards: Sequence[Shard], columns: Sequence[str], n: int, spread: int = 16) -> pa.Table:
    """``n`` rows from across the planned input: the first rows of up to ``spread`` shards
    spaced evenly through the plan (deterministic, cheap, and not fooled by an input sorted
    by length or by category, as the first ``n`` rows would be)."""
    picked = sample_shards(shards, spread)
    if not picked:
        return pa.table({c: [] for c in columns})
    tables: list[pa.Table] = []
    have = 0
    for i, shard in enumerate(picked):
        quota = -(-(n - have) // (len(picked) - i))  # the rest, shared by the shards left
        batches = []
        for batch in read_shard(shard, columns, on_bad_row=lambda _row, _msg: None):
            batches.append(batch.drop_columns([ROW]))
            if sum(b.num_rows for b in batches) >= quota:
                break
        if batches:
            taken = pa.Table.from_batches(batches).slice(0, quota)
            tables.append(taken)
            have += taken.num_rows
    return pa.concat_tables(tables) if tables else pa.table({c: [] for c in columns})


def run_adapter(adapter: Adapter, table: pa.Table, batch_size: int) -> dict[str, np.ndarray]:
    """Every output column of ``adapter`` over ``table``, in row order, as numpy arrays."""
    return {name: to_numpy_column(col) for name, col in predict_table(adapter, table, batch_size).items()}


def compare_embeddings(ref: np.ndarray, got: np.ndarray, k: int = 10) -> dict[str, float]:
    """Mean and minimum per-row cosine, and the mean overlap of each row's k nearest neighbours."""
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)
    rn = ref / np.clip(np.linalg.norm(ref, axis=1, keepdims=True), 1e-12, None)
    gn = got / np.clip(np.linalg.norm(got, axis=1, keepdims=True), 1e-12, None)
    cos = (rn * gn).sum(axis=1)
    k = min(k, len(ref) - 1)
    overlap = 1.0
    if k > 0:

        def neighbours(x: np.ndarray) -> np.ndarray:
            sim = x @ x.T
            np.fill_diagonal(sim, -np.inf)
            return np.argsort(-sim, axis=1)[:, :k]

        a, b = neighbours(rn), neighbours(gn)
        overlap = float(np.mean([len(set(a[i]) & set(b[i])) / k for i in range(len(a))]))
    return {
        "mean_cosine": round(float(cos.mean()), 6),
        "min_cosine": round(float(cos.min()), 6),
        "top10_overlap": round(overlap, 4),
    }


def quality_gate(
    candidate: Adapter,
    reference: Adapter,
    sample: pa.Table,
    *,
    batch_size: int,
    floor: float,
    precision: str,
    threads: int,
    outputs: dict[str, pa.Array] | None = None,
    remedy: str = "a higher precision",
) -> dict[str, Any]:
    """Compare ``candidate`` (set up) with ``reference`` (fp32, set up here) on ``sample``; raise
    below ``floor``, naming ``remedy`` as what to use instead. ``outputs``, when given, receives
    the candidate's results (output rows) if it passes."""
    reference.setup(SetupContext(threads=threads))
    columns = predict_table(candidate, sample, batch_size)
    got = {name: to_numpy_column(col) for name, col in columns.items()}
    ref = run_adapter(reference, sample, batch_size)
    reference.close()
    figures: dict[str, Any] = {"precision": precision, "reference": "fp32", "rows": sample.num_rows, "floor": floor}
    name = "embedding" if "embedding" in got else next(iter(got), None)
    if name is None or sample.num_rows == 0:
        figures["passed"] = True
        if outputs is not None:
            outputs.update(columns)
        return figures
    figures["passed"] = bool(_closeness(name, ref[name], got[name], figures) >= floor)
    log.info(
        "quality gate (%s vs fp32 on %d rows): %s",
        precision,
        sample.num_rows,
        ", ".join(f"{k}={v}" for k, v in figures.items() if k not in ("precision", "reference", "rows")),
    )
    if not figures["passed"]:
        shown = ", ".join(
            f"{k} {v}"
            for k, v in figures.items()
            if k in ("mean_cosine", "min_cosine", "top10_overlap", "mean_relative_error", "agreement", "boxes_matched")
        )
        err = QualityGateError(
            f"quality gate: {precision} is too far from fp32 on {sample.num_rows} rows of this job ({shown}; "
            f"floor {floor}); use {remedy}, or lower runtime.quality_floor if this is acceptable"
        )
        err.figures = figures
        err.reference = dict(ref)
        raise err
    if outputs is not None:
        outputs.update(columns)
    return figures


def _closeness(name: str, ref: Any, got: Any, figures: dict[str, Any]) -> float:
    """How close the candidate's output column ``name`` is to fp32's, by the column's kind (its
    figures added to ``figures``): boxes found, embeddings' cosine, relative error, agreement."""
    a, b = np.asarray(ref), np.asarray(got)
    if name == "detections":  # boxes found as fp32 finds them: same label, IoU >= 0.9
        figures.update(compare_detections(list(ref), list(got)))
        return float(figures["boxes_matched"])
    if a.ndim == 2 or (a.dtype == object and len(a) and np.ndim(a[0]) == 1):
        figures.update(compare_embeddings(np.stack(list(a)), np.stack(list(b))))
        return float(figures["mean_cosine"])
    if np.issubdtype(a.dtype, np.floating):
        rel = np.abs(a - b) / np.clip(np.abs(a), 1e-12, None)
        figures["mean_relative_error"] = round(float(rel.mean()), 6)
        return 1.0 - figures["mean_relative_error"]
    figures["agreement"] = round(float(np.mean(a == b)), 6)
    return float(figures["agreement"])


def job_quality_gate(
    cfg: JobConfig,
    adapter: Adapter,
    model: ResolvedModel,
    shards: Sequence[Shard],
    ledger: OutputLedger,
    figures_of: GateFigures | None = None,
) -> tuple[dict[str, Any] | None, GateRows | None]:
    """The gate for a job with a lowered precision, on its own rows; once per output and floor
    (the figures are kept in ``_bulkinfer/quality.json``). None for fp32. ``figures_of``:
    where the figures are computed (default :func:`gate_figures`, in this process). With the
    figures, the sample rows and their results when they were computed here (:class:`GateRows`)."""
    rt = cfg.runtime
    if rt.precision == "fp32" and cfg.source.decode == "exact":
        return None, None
    cached = ledger.read_private("quality.json")
    if cached is not None and cached.get("floor") == rt.quality_floor and cached.get("passed"):
        return cached, None
    t0 = time.perf_counter()
    # a gate run here is kept for this machine kind; one on a cluster's worker is not (its kind is not known here)
    sample = sample_rows(shards, list(adapter.input_columns), rt.quality_sample_rows) if figures_of is None else None
    verdict = verdict_path(cfg, adapter, model, sample) if sample is not None else None
    built_with = sorted(getattr(adapter, "int8_fp32_groups", None) or [])
    figures = _read_verdict(verdict) if verdict is not None else None
    outputs: dict[str, pa.Array] = {}
    if figures is not None and verdict is not None:
        log.info("quality gate: passed on this machine kind for the same model, settings and sample rows (%s)",
                 verdict.name)  # fmt: skip
    else:  # the rows taken for the key are the gate's (read once)
        figures = (
            sample_figures(cfg, adapter, model, sample, outputs)
            if sample is not None
            else (figures_of or gate_figures)(cfg, adapter, model, shards)
        )
        if (
            verdict is not None
            and figures.get("passed")
            and sorted(figures.get("int8_fp32_groups") or []) == built_with
        ):
            _write_verdict(verdict, figures)  # not a search's new choice: the next build starts from it
        figures = {**figures, "cached": False}
    figures["gate_s"] = round(time.perf_counter() - t0, 3)
    ledger.write_private("quality.json", figures)
    return figures, GateRows(sample, outputs) if sample is not None and outputs else None


def verdict_path(cfg: JobConfig, adapter: Adapter, model: ResolvedModel, sample: pa.Table) -> Path:
    """Where a passed gate's figures are kept for every output on this machine kind: keyed by the
    model, the precision and engine as built (int8 blocks kept in fp32 included), the floor, the
    machine kind, the libraries' versions and the gate's sample rows themselves, so a rerun over
    the same data into a new output starts at once and anything else is gated again."""
    rt = cfg.runtime
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, sample.schema) as writer:
        writer.write_table(sample)
    libraries = {}
    for name in ("onnxruntime", "torch", "openvino", "nncf"):
        try:
            libraries[name] = version(name)
        except PackageNotFoundError:
            libraries[name] = ""
    key = {
        "model": model.digest, "precision": rt.precision, "engine": rt.engine, "floor": rt.quality_floor,
        **({"decode": cfg.source.decode} if cfg.source.decode != "exact" else {}),
        "fp32_groups": sorted(getattr(adapter, "int8_fp32_groups", None) or []), "rows_per_call": rt.rows_per_call,
        "machine": isa_key(), "bulkinfer": __version__, "libraries": libraries,
        "sample": hashlib.sha256(out.getvalue()).hexdigest(),
    }  # fmt: skip
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    cache = Path(rt.cache_dir).expanduser() if rt.cache_dir else default_cache_dir()
    return cache / "gates" / f"{name}.json"


def _read_verdict(path: Path) -> dict[str, Any] | None:
    try:
        figures = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {**figures, "cached": True} if isinstance(figures, dict) and figures.get("passed") else None


def _write_verdict(path: Path, figures: dict[str, Any]) -> None:
    """Atomically; a cache that cannot be written only means the next run gates again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(figures), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("quality gate: cannot keep the verdict in %s (%s)", path, exc)


def gate_figures(cfg: JobConfig, adapter: Adapter, model: ResolvedModel, shards: Sequence[Shard]) -> dict[str, Any]:
    """The gate's figures for ``adapter`` (set up, in the job's precision) against fp32 on the
    job's rows; the int8 search when full int8 fails and may be searched."""
    sample = sample_rows(shards, list(adapter.input_columns), cfg.runtime.quality_sample_rows)
    return sample_figures(cfg, adapter, model, sample)


def sample_figures(
    cfg: JobConfig,
    adapter: Adapter,
    model: ResolvedModel,
    sample: pa.Table,
    outputs: dict[str, pa.Array] | None = None,
) -> dict[str, Any]:
    """:func:`gate_figures` on rows already taken (a DataFrame's sample, for ``bulkinfer.spark.predict``);
    ``outputs`` receives the results of the build that passed."""
    rt = cfg.runtime
    # the reference is plain fp32: not TensorRT's, whose fp32 may round through TF32
    fp32_cfg = cfg.model_copy(
        update={
            "runtime": rt.model_copy(update={"precision": "fp32", "tensorrt": False}),
            "source": cfg.source.model_copy(update={"decode": "exact"}),  # pictures: the exact decode is the reference
        }
    )
    reference = build_adapter(fp32_cfg, model)
    threads = rt.threads or available_cpus()
    try:
        figures = quality_gate(
            adapter,
            reference,
            sample,
            batch_size=rt.rows_per_call,
            floor=rt.quality_floor,
            threads=threads,
            outputs=outputs,
            **_what_is_gated(cfg),
        )
        kept = getattr(adapter, "int8_fp32_groups", None)
        if rt.precision == "int8" and kept:  # a cached or named choice: say it (Ray's workers build it too)
            figures["int8_fp32_groups"] = list(kept)
    except QualityGateError as failed:
        if not searchable(cfg, adapter):
            raise
        figures = partial_int8(adapter, build_adapter(fp32_cfg, model), sample, cfg, model.digest, failed, outputs)
    return figures


def _what_is_gated(cfg: JobConfig) -> dict[str, str]:
    """How the gate names the candidate and what to use instead: a lowered precision, or pictures
    decoded smaller (``source.decode = "reduced"``, gated against the exact decode)."""
    precision = cfg.runtime.precision
    if cfg.source.decode == "exact":
        return {"precision": precision}
    return {"precision": f"{precision} with reduced decode", "remedy": 'source.decode = "exact"'}


def searchable(cfg: JobConfig, adapter: Adapter) -> bool:
    """Whether an int8 that failed the gate can be searched for blocks to keep in fp32."""
    from ..adapters.text import TextEmbeddingAdapter

    rt = cfg.runtime
    return (
        rt.precision == "int8"
        and rt.int8_fp32_groups is None
        and isinstance(adapter, TextEmbeddingAdapter)
        and adapter.engine_name == "onnxruntime"
    )


def partial_int8(
    adapter: Any,
    reference: Adapter,
    sample: pa.Table,
    cfg: JobConfig,
    digest: str,
    failed: QualityGateError,
    outputs: dict[str, pa.Array] | None = None,
) -> dict[str, Any]:
    """Full int8 failed the gate: keep the fewest most-sensitive groups in fp32 that pass it
    (:mod:`bulkinfer.engines.int8`), reload ``adapter`` with them, cache the choice; or raise
    with every build tried when only fp32 would pass. ``outputs`` receives the kept build's results."""
    from ..engines.int8 import save_plan, search

    trial = _Int8Search(adapter, reference, sample, cfg, failed)
    full = failed.figures.get("mean_cosine")
    baseline = float(full) if trial.channels and isinstance(full, (int, float)) else None
    result = search(trial.order, trial.score, cfg.runtime.quality_floor, baseline=baseline,
                    without_first=trial.blocks_alone)  # fmt: skip
    figures = trial.figures(result, full, failed)
    if result.keep_fp32 is None:
        raise trial.refusal(figures)
    keep = result.keep_fp32
    adapter.reload_engine(keep)
    if outputs is not None:
        outputs.update(trial.results[tuple(keep)])
    figures.update(trial.found[tuple(keep)])
    figures.update({"passed": True, "int8_fp32_groups": keep})
    rt = cfg.runtime
    cache = Path(rt.cache_dir).expanduser() if rt.cache_dir else default_cache_dir()
    save_plan(cache, digest, rt.quality_floor, {"fp32_groups": keep, **figures})
    log.info(
        "quality gate: full int8 failed (mean_cosine %s); with %s kept in fp32 it passes (mean_cosine %s)",
        figures["full_int8_mean_cosine"], ", ".join(keep), figures["mean_cosine"],
    )  # fmt: skip
    return figures


class _Int8Search:
    """The builds :func:`partial_int8` tries: the fp32 answer, the groups in the order to keep them
    in fp32 (first the feed-forward blocks' outlier channels, cheap and data-free, then whole
    blocks by sensitivity, measured with those channels already out of int8), each build's score."""

    def __init__(
        self, adapter: Any, reference: Adapter, sample: pa.Table, cfg: JobConfig, failed: QualityGateError
    ) -> None:
        from ..engines.int8 import OUTLIERS, outlier_channels, sensitivities

        self.adapter, self.sample, self.cfg = adapter, sample, cfg
        rt = cfg.runtime
        self.threads = rt.threads or available_cpus()
        if failed.reference is not None and "embedding" in failed.reference:  # the failed gate's fp32 pass: reused
            self.ref = np.stack(list(failed.reference["embedding"]))
        else:
            reference.setup(SetupContext(threads=self.threads))
            self.ref = np.stack(list(run_adapter(reference, sample, rt.rows_per_call)["embedding"]))
            reference.close()
        features = adapter.preprocess(sample.slice(0, 64))
        self.batches = [adapter.select(features, np.arange(i, min(i + 16, len(features))))
                        for i in range(0, len(features), 16)]  # fmt: skip
        self.fp32_path = adapter._engine.fp32_path
        self.reduce_range = int8_scheme()["reduce_range"]
        self.channels = outlier_channels(self.fp32_path, str(adapter.layout.transformer_dir), self.threads)
        self.sens = sensitivities(self.fp32_path, self.batches, self.reduce_range, self.threads, exact=self.channels)
        self.order = ([OUTLIERS] if self.channels else []) + sorted(self.sens, key=lambda g: -self.sens[g])
        self.seconds: dict[tuple[str, ...], float] = {}
        self.found: dict[tuple[str, ...], dict[str, float]] = {}
        self.results: dict[tuple[str, ...], dict[str, pa.Array]] = {}

    def score(self, keep: list[str]) -> float:
        """The mean cosine to fp32 of the build with ``keep`` in fp32 (its results and time kept)."""
        self.adapter.reload_engine(keep)
        t0 = time.perf_counter()
        key = tuple(keep)
        self.results[key] = predict_table(self.adapter, self.sample, self.cfg.runtime.rows_per_call)
        got = to_numpy_column(self.results[key]["embedding"])
        self.seconds[key] = time.perf_counter() - t0
        self.found[key] = compare_embeddings(self.ref, np.stack(list(got)))
        return self.found[key]["mean_cosine"]

    def blocks_alone(self) -> list[str]:
        """The split bought nothing here: blocks ranked with every channel in int8."""
        from ..engines.int8 import sensitivities

        self.sens.clear()
        self.sens.update(sensitivities(self.fp32_path, self.batches, self.reduce_range, self.threads))
        return sorted(self.sens, key=lambda g: -self.sens[g])

    def figures(self, result: Any, full: Any, failed: QualityGateError) -> dict[str, Any]:
        steps = [{**s, "seconds": round(self.seconds[tuple(s["groups"])], 3)} for s in result.steps]
        figures = {**getattr(failed, "figures", {}), "full_int8_mean_cosine": full, "int8_search": steps,
                   "sensitivity": {g: round(self.sens[g], 5) for g in result.order if g in self.sens}}  # fmt: skip
        if result.dropped:
            figures["int8_search_dropped"] = result.dropped
            log.info(
                "quality gate: keeping the outlier channels in fp32 scores %s, no closer than full int8 (%s) on "
                "this machine: searched the blocks alone",
                steps[0]["mean_cosine"], full,
            )  # fmt: skip
        return figures

    def refusal(self, figures: dict[str, Any]) -> QualityGateError:
        """Only fp32 passes: the error lists every build tried (the adapter back to full int8)."""
        from ..engines.int8 import kept_in_words

        self.adapter.reload_engine([])
        tried = "; ".join(f"{kept_in_words(s['groups'])} in fp32: {s['mean_cosine']}" for s in figures["int8_search"])
        err = QualityGateError(
            f"quality gate: int8 is too far from fp32 on {self.sample.num_rows} rows of this job even with its most "
            f"sensitive parts kept in fp32 ({tried}; floor {self.cfg.runtime.quality_floor}); use fp32, or lower "
            "runtime.quality_floor if this is acceptable"
        )
        err.figures = {**figures, "passed": False}
        return err
