"""``bulkinfer tune``: measure candidate settings on a sample of the job's own input and
keep the fastest one that passes the quality gate.

Candidates are engine x precision x batch size (x intra-op threads when the machine has
more than two CPUs). Each engine/precision is set up once, gated against fp32 on the
sample, then timed at every batch size after a warm-up pass over the same sample. An int8 that fails the gate
whole is searched for the fewest transformer blocks to keep in fp32 (the job's gate does
the same), and that partial int8 is the candidate measured. The result is a tuned config
(the job's own, with ``runtime`` changed) and a table of every candidate.

``runtime.precision = "auto"`` (:func:`auto_precision`) reads these measurements: the
fastest gate-passing precision for the model on this kind of machine, never one emulated
here; without measurements it calibrates once on a small sample and keeps the result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..adapters import GPU_BATCH_SIZES, Adapter, ResolvedModel, SetupContext, build_adapter, resolve_model
from ..config import JobConfig
from ..config.load import toml_value
from ..core.errors import BulkinferError, ConfigError, QualityGateError
from ..core.hardware import available_cpus
from ..core.storage import use_storage_options
from ..engines import choose_engine, default_cache_dir
from ..sinks import write_bytes
from ..sources import Shard, list_inputs, plan_shards
from .gate import partial_int8, quality_gate, run_adapter, sample_rows, searchable

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("bulkinfer")

__all__ = [
    "Candidate",
    "TuneResult",
    "auto_batch_size",
    "auto_precision",
    "best_measured",
    "results_path",
    "to_toml",
    "tune",
]

PRECISIONS = (
    ("onnxruntime", "fp32"),
    ("onnxruntime", "int8"),
    ("openvino", "fp32"),
    ("openvino", "int8"),
    ("torch", "fp32"),
    ("torch", "bf16"),
    ("torch", "fp16"),
)
BATCH_SIZES = (8, 16, 32, 64)
PICTURE_KINDS = ("image-onnx", "nudenet")
PICTURE_PRECISIONS = (("onnxruntime", "fp32"), ("openvino", "fp32"), ("openvino", "bf16"))
"""What ``tune`` measures for an ONNX picture model (bf16 gated on the job's boxes, where not emulated)."""
PICTURE_BATCH_SIZES = (1, 4, 8, 16)


@dataclass
class Candidate:
    engine: str
    precision: str
    batch_size: int
    threads: int
    rows_per_s: float | None = None
    quality: dict[str, Any] | None = None
    passed: bool = True
    note: str = ""
    int8_fp32_groups: list[str] | None = None
    """int8: the blocks kept in fp32 (found by the gate's search, or cached from an earlier one)."""
    processes: int = 1
    """Models precisions do not apply to: processes run at once (1: this one, every CPU's threads)."""
    cpu_per_wall: float | None = None


@dataclass
class TuneResult:
    candidates: list[Candidate] = field(default_factory=list)
    best: Candidate | None = None
    config: JobConfig | None = None
    sample_rows: int = 0


def _thread_options(device: str) -> list[int]:
    n = available_cpus()
    return [n] if n <= 2 or device.startswith("cuda") else sorted({max(1, n // 2), n})  # a GPU: threads matter little


def candidates_for(device: str) -> tuple[tuple[tuple[str, str], ...], tuple[int, ...]]:
    """What ``tune`` tries by default on ``device``: every engine/precision pair and small batches
    on a CPU (openvino's when it is installed); on a GPU the torch pairs (onnxruntime runs there
    only with its CUDA build) and batches from 64 to 1024."""
    if device.startswith("cuda"):
        return tuple(p for p in PRECISIONS if p[0] == "torch"), GPU_BATCH_SIZES
    return tuple(p for p in PRECISIONS if p[0] != "openvino" or _installed("openvino")), BATCH_SIZES


def _choices(
    device: str, kind: str, batch_sizes: tuple[int, ...] | None, precisions: tuple[tuple[str, str], ...] | None
) -> tuple[tuple[int, ...], tuple[tuple[str, str], ...]]:
    """The batch sizes and engine/precision pairs to measure (asked for, else the defaults for
    the model's kind and the device); a pair not known for the kind is refused."""
    if kind in PICTURE_KINDS:
        known: tuple[tuple[str, str], ...] = PICTURE_PRECISIONS
        default_pairs = tuple(p for p in PICTURE_PRECISIONS if p[0] != "openvino" or _installed("openvino"))
        default_sizes: tuple[int, ...] = PICTURE_BATCH_SIZES
    else:
        known = PRECISIONS
        default_pairs, default_sizes = candidates_for(device)
    batch_sizes, precisions = batch_sizes or default_sizes, precisions or default_pairs
    unknown = [p for p in precisions if p not in known]
    if unknown:
        names = ", ".join(f"{e}/{p}" for e, p in known)
        raise ConfigError(f"tune --candidates: {'/'.join(unknown[0])} is not one of {names}")
    return batch_sizes, precisions


def _installed(name: str) -> bool:
    from importlib.util import find_spec

    return find_spec(name) is not None


def tune(
    cfg: JobConfig,
    sample_size: int = 512,
    batch_sizes: tuple[int, ...] | None = None,
    on_candidate: Callable[[Candidate], None] = lambda c: None,
    precisions: tuple[tuple[str, str], ...] | None = None,
    int8_search: bool = True,
) -> TuneResult:
    """Measure every candidate (``precisions``: the engine/precision pairs to try) on
    ``sample_size`` rows from across ``cfg``'s input; with ``int8_search``, an int8 that
    fails the gate is searched for the blocks to keep in fp32 (several builds). By default
    every pair and ``BATCH_SIZES``; on a GPU the torch pairs and ``GPU_BATCH_SIZES``."""
    if cfg.runtime.tensorrt:
        raise ConfigError(
            "runtime.tensorrt: bulkinfer tune measures torch and onnxruntime without TensorRT; run it with "
            "runtime.tensorrt = false, and give a TensorRT job its runtime.batch_size yourself"
        )
    if not cfg.source.paths or not cfg.model.name:
        raise ConfigError("tune needs source.paths and model.name (a job file or --input/--model)")
    model = resolve_model(cfg)
    batch_sizes, precisions = _choices(cfg.runtime.device, model.kind, batch_sizes, precisions)
    use_storage_options(cfg.source.storage_options, cfg.source.paths)
    shards = plan_shards(list_inputs(cfg.source.paths, cfg.source.format, cfg.source), cfg.source.shard_rows, [])
    if model.kind in ("tabular", "custom", "onnx"):
        return _tune_processes(cfg, model, shards, sample_size, on_candidate)
    if model.kind not in ("text-embedding", *PICTURE_KINDS):
        raise ConfigError(f"tune: measures text, picture, tabular and custom models; this one is {model.kind}")
    from ..core.hardware import emulated

    tuning = _Tuning(cfg, model, shards, sample_size, batch_sizes, on_candidate, int8_search)
    for engine, precision in precisions:
        if emulated(cfg.runtime.device, precision):  # slower than fp32 by construction: not worth the minutes
            tuning.found(
                Candidate(engine, precision, 0, available_cpus(), passed=False, note="emulated here: not measured")
            )
            continue
        for threads in _thread_options(cfg.runtime.device):
            tuning.measure(engine, precision, threads)
    return _choose(cfg, model.digest, tuning.result)


class _Tuning:
    """One ``tune`` run over a text or picture model: each engine, precision and thread count
    built, gated against fp32 and timed at every batch size."""

    def __init__(
        self,
        cfg: JobConfig,
        model: ResolvedModel,
        shards: Sequence[Shard],
        sample_size: int,
        batch_sizes: tuple[int, ...],
        on_candidate: Callable[[Candidate], None],
        int8_search: bool,
    ) -> None:
        self.cfg, self.model, self.shards, self.sample_size = cfg, model, shards, sample_size
        self.batch_sizes, self.on_candidate, self.int8_search = batch_sizes, on_candidate, int8_search
        self.result = TuneResult()
        self.sample: pa.Table | None = None

    def found(self, c: Candidate) -> None:
        self.result.candidates.append(c)
        self.on_candidate(c)

    def measure(self, engine: str, precision: str, threads: int) -> None:
        rt = self.cfg.runtime.model_copy(
            update={"engine": engine, "precision": precision, "threads": threads, "batch_size": 16}
        )
        trial = self.cfg.model_copy(update={"runtime": rt})
        try:
            adapter = build_adapter(trial, self.model)
            adapter.setup(SetupContext(threads=threads, device=rt.device))
        except BulkinferError as exc:
            self.found(Candidate(engine, precision, 0, threads, passed=False, note=str(exc)[:80]))
            return
        if self.sample is None:
            self.sample = sample_rows(self.shards, list(adapter.input_columns), self.sample_size)
            self.result.sample_rows = self.sample.num_rows
        sample = self.sample
        quality, passed, note = self._gate(adapter, trial, sample) if precision != "fp32" else (None, True, "")
        kept = getattr(adapter, "int8_fp32_groups", None) if precision == "int8" else None
        groups = list(kept) if kept else None
        if groups:
            note = f"{len(groups)} block(s) in fp32: {', '.join(groups)}"
        for bs in self.batch_sizes:
            c = Candidate(engine, precision, bs, threads, quality=quality, passed=passed, note=note,
                          int8_fp32_groups=groups)  # fmt: skip
            if passed:
                # warm-up: the whole sample once at this batch size, so every shape the timed pass
                # meets was seen (torch builds its kernels per shape: one warm batch left the first
                # sizes measured cold, their figures rising with the order they were measured in)
                run_adapter(adapter, sample, bs)
                t0 = time.perf_counter()
                run_adapter(adapter, sample, bs)
                c.rows_per_s = round(sample.num_rows / (time.perf_counter() - t0), 1)
            self.found(c)
        adapter.close()

    def _gate(self, adapter: Adapter, trial: JobConfig, sample: pa.Table) -> tuple[dict[str, Any] | None, bool, str]:
        """The lowered precision against fp32 (the quality figures, passed, a note); an int8 that
        fails is searched for the fewest blocks in fp32 that pass, as the job's gate would."""
        rt = trial.runtime
        ref_engine = "torch" if rt.device.startswith("cuda") else "onnxruntime"  # no ORT CUDA needed
        ref_cfg = self.cfg.model_copy(
            update={"runtime": rt.model_copy(update={"precision": "fp32", "engine": ref_engine})}
        )
        reference = build_adapter(ref_cfg, self.model)
        try:
            quality = quality_gate(adapter, reference, sample, batch_size=16, floor=rt.quality_floor,
                                   precision=rt.precision, threads=rt.threads or available_cpus())  # fmt: skip
            return quality, True, ""
        except QualityGateError as exc:
            if not (self.int8_search and searchable(trial, adapter)):
                return dict(exc.figures), False, "below the quality floor"
            try:
                fixed = build_adapter(ref_cfg, self.model)
                return partial_int8(adapter, fixed, sample, trial, self.model.digest, exc), True, ""
            except QualityGateError as none:
                return dict(none.figures), False, "below the floor even with blocks in fp32"


def _choose(cfg: JobConfig, digest: str, result: TuneResult) -> TuneResult:
    """The fastest passing candidate becomes the tuned config, saved for ``precision = "auto"``."""
    passing = [c for c in result.candidates if c.passed and c.rows_per_s]
    if not passing:
        raise ConfigError("tune: no candidate passed; check the model and runtime.quality_floor")
    best = max(passing, key=lambda c: c.rows_per_s or 0.0)
    result.best = best
    rt = cfg.runtime.model_copy(
        update={
            "engine": best.engine,
            "precision": best.precision,
            "batch_size": best.batch_size,
            "threads": best.threads,
            "int8_fp32_groups": best.int8_fp32_groups,
        }
    )
    result.config = cfg.model_copy(update={"runtime": rt})
    _save(results_path(cfg, digest), result)
    return result


DEFAULT_BATCH = 16
CALIBRATION_ROWS = 128
PROCESS_SAMPLE_ROWS = 20_000
SPEEDUP_TO_SPLIT = 1.2
"""Processes beat one process when they measure this much faster (below it, the Ray backend's
own cost would eat the gain)."""


def _tune_processes(
    cfg: JobConfig, model: Any, shards: Sequence[Shard], sample_size: int, on_candidate: Callable[[Candidate], None]
) -> TuneResult:
    """A model precisions do not apply to: one process with every CPU's threads against one
    single-threaded process per CPU; the tuned job runs the faster (the Ray backend with
    ``num_cpus = 1`` for the second)."""
    from .measure import measure

    cfg = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"precision": "fp32"})})  # "auto" too
    adapter = build_adapter(cfg, model)
    size = cfg.runtime.batch_size if "batch_size" in cfg.runtime.model_fields_set else adapter.batch_size_hint
    size = size if isinstance(size, int) else DEFAULT_BATCH
    sample = sample_rows(shards, list(adapter.input_columns), max(sample_size, PROCESS_SAMPLE_ROWS))
    if not sample.num_rows:
        raise ConfigError("tune: the input has no rows to measure on")
    cpus = available_cpus()
    result = TuneResult(sample_rows=sample.num_rows)
    for n in [1, cpus] if cpus > 1 else [1]:
        got = measure(cfg, model, sample, size, n)
        c = Candidate(model.kind, "fp32", size, 1 if n > 1 else cpus, rows_per_s=got.rows_per_s, processes=n,
                      cpu_per_wall=got.cpu_per_wall, note=f"{got.cpu_per_wall} CPU s per s")  # fmt: skip
        result.candidates.append(c)
        on_candidate(c)
    one = result.candidates[0]
    best = max(result.candidates, key=lambda c: c.rows_per_s or 0.0)
    if best is not one and (best.rows_per_s or 0.0) < SPEEDUP_TO_SPLIT * (one.rows_per_s or 0.0):
        best = one
    result.best = best
    rt = cfg.runtime.model_copy(update={"batch_size": size, "threads": best.threads})
    ex = cfg.execution
    if best.processes > 1:
        ex = ex.model_copy(update={"backend": "ray", "num_cpus": 1.0, "workers": best.processes})
    result.config = cfg.model_copy(update={"runtime": rt, "execution": ex})
    _save(results_path(cfg, model.digest), result)
    return result


def auto_precision(cfg: JobConfig, model: Any) -> tuple[str, str, str]:
    """``(engine, precision, why)`` for ``runtime.precision = "auto"``: the fastest candidate
    whose gate passed among ``tune``'s measurements for this model on this machine kind,
    among the engines ``runtime.engine`` allows and never a precision emulated here. With no
    measurements, a calibration: ``tune`` on ``CALIBRATION_ROWS`` rows of the job at its
    batch size, kept where ``tune`` keeps its results (so it runs once per machine kind)."""
    from ..core import hardware
    from ..core.hardware import emulated, isa_key

    rt = cfg.runtime
    allowed = [
        (e, p) for e, p in candidates_for(rt.device)[0] if rt.engine in ("auto", e) and not emulated(rt.device, p)
    ]
    fp32_engine = choose_engine(rt.engine, "fp32", rt.device)  # when nothing measured can be taken
    path = results_path(cfg, model.digest)
    measured = _candidates(path)
    source = f"measured by bulkinfer tune, {path}"
    if measured is None:
        if not hardware.device_here(rt.device):
            return fp32_engine, "fp32", f"no tune result for this model on {rt.device} and no GPU here to calibrate on"
        if not cfg.source.paths:  # serve: no rows of a job to calibrate on
            return (
                fp32_engine,
                "fp32",
                (
                    f"no tune result for this model on this machine ({isa_key()}) and no input to calibrate on; "
                    "run bulkinfer tune"
                ),
            )
        size = rt.batch_size if isinstance(rt.batch_size, int) else DEFAULT_BATCH
        log.info(
            "runtime.precision = auto: no tune result for this model on this machine (%s); calibrating %s on "
            "%d rows of the job (once; kept in %s)",
            isa_key(), ", ".join(f"{e} {p}" for e, p in allowed), CALIBRATION_ROWS, path,
        )  # fmt: skip
        calibration = cfg.model_copy(update={"runtime": rt.model_copy(update={"precision": "fp32"})})
        result = tune(calibration, CALIBRATION_ROWS, (size,), precisions=tuple(allowed))
        measured = [asdict(c) for c in result.candidates]
        source = f"calibrated now on {CALIBRATION_ROWS} rows, kept in {path}"
    usable = [c for c in measured if (c["engine"], c["precision"]) in allowed and c["passed"] and c.get("rows_per_s")]
    if not usable:
        return fp32_engine, "fp32", f"nothing measured passed ({source})"
    best = max(usable, key=lambda c: c["rows_per_s"])
    fp32 = max((c["rows_per_s"] for c in usable if c["precision"] == "fp32"), default=None)
    against = f" against fp32's {fp32}" if fp32 and best["precision"] != "fp32" else ""
    skipped = [p for e, p in PRECISIONS if rt.engine in ("auto", e) and emulated(rt.device, p)]
    left = f"; {', '.join(sorted(set(skipped)))} left out: emulated here" if skipped else ""
    why = f"{best['rows_per_s']} rows/s{against} ({source}){left}"
    return best["engine"], best["precision"], why


def _machine() -> str:
    """What makes a measurement hold on another machine: CPU model, CPUs usable, architecture and
    the instruction sets the fast paths use (hardware.isa_key)."""
    from ..core.hardware import cpu, isa_key

    return f"{cpu()['model']} x{available_cpus()} {isa_key()}"


def measured_here(cfg: JobConfig, model_digest: str) -> str | None:
    """What ``tune`` measured for the job's engine and precision against fp32 on this machine
    (best rows/s of each, the gate's mean cosine), for the warning before a run; None when
    it measured neither."""
    rt = cfg.runtime
    measured = _candidates(results_path(cfg, model_digest))
    if measured is None:
        return None

    def best(precision: str, engine: str | None = None) -> dict[str, Any] | None:
        rows = [c for c in measured if c["precision"] == precision and c.get("rows_per_s")
                and (engine is None or c["engine"] == engine)]  # fmt: skip
        return max(rows, key=lambda c: c["rows_per_s"], default=None)

    mine, fp32 = best(rt.precision, choose_engine(rt.engine, rt.precision, rt.device)), best("fp32")
    if mine is None or fp32 is None:
        return None
    cosine = (mine.get("quality") or {}).get("mean_cosine")
    gate = f", gate mean cosine {cosine}" + ("" if mine["passed"] else " (failed)") if cosine is not None else ""
    return (
        f"bulkinfer tune measured {rt.precision} here at {mine['rows_per_s']} rows/s against fp32's "
        f"{fp32['rows_per_s']} ({mine['rows_per_s'] / fp32['rows_per_s']:.2f}x){gate}"
    )


def _candidates(path: Path) -> list[dict[str, Any]] | None:
    """The candidates ``tune`` saved at ``path`` (:func:`results_path`); None when there is no
    readable result."""
    try:
        candidates: list[dict[str, Any]] = json.loads(path.read_text())["candidates"]
    except (OSError, ValueError, KeyError):
        return None
    return candidates


def results_path(cfg: JobConfig, model_digest: str) -> Path:
    """Where ``tune`` keeps its measurements for this model, device, machine and ONNX export version."""
    root = Path(cfg.runtime.cache_dir).expanduser() if cfg.runtime.cache_dir else default_cache_dir()
    from ..core.hardware import gpu
    from ..engines.versions import EXPORT

    where = cfg.runtime.device + (f" {gpu(cfg.runtime.device)}" if cfg.runtime.device.startswith("cuda") else "")
    # the export's version too: figures measured on an older graph are not this one's
    key = hashlib.sha256(f"{_machine()}|{where}|export {EXPORT}".encode()).hexdigest()[:12]
    return root / "tune" / f"{model_digest[:16]}-{key}.json"


def best_measured(cfg: JobConfig, model_digest: str, devices: list[str]) -> dict[str, str]:
    """For ``bulkinfer machine``: what ``tune`` measured for the model on this machine kind, on
    each of ``devices``: the fastest candidate that passed, or that nothing was measured."""
    out: dict[str, str] = {}
    for where in devices:
        rt = cfg.runtime.model_copy(update={"device": where})
        candidates = _candidates(results_path(cfg.model_copy(update={"runtime": rt}), model_digest))
        if candidates is None:
            out[where] = "not measured (run bulkinfer tune on this machine)"
            continue
        passed = [c for c in candidates if c.get("passed") and c.get("rows_per_s")]
        best = max(passed, key=lambda c: c["rows_per_s"], default=None)
        out[where] = (
            f"{best['engine']} {best['precision']}, batch {best['batch_size']}: {best['rows_per_s']} rows/s"
            if best
            else "nothing passed"
        )
    return out


def _save(path: Path, result: TuneResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"machine": _machine(), "measured": time.time(), "candidates": [asdict(c) for c in result.candidates]}
    write_bytes(path.parent, path.name, json.dumps(body, indent=1).encode(), 0, crash_at=None, what="the tune results")


def auto_batch_size(cfg: JobConfig, model_digest: str, hint: int | None = None) -> tuple[int, str]:
    """The batch size for ``runtime.batch_size = "auto"``, and where it came from.

    The fastest gate-passing size ``tune`` measured for this model with the job's engine and
    precision on this machine (preferring the job's thread count; for a model precisions do
    not apply to, the size tune measured it at); else the model's own ``hint``, else 16.
    """
    rt = cfg.runtime
    fallback = hint or DEFAULT_BATCH
    default = f"the model's default, {hint}" if hint else "the default"
    path = results_path(cfg, model_digest)
    candidates = _candidates(path)
    if candidates is None:
        why = f"no tune result for this model on this machine; using {default}; run bulkinfer tune to measure"
        return fallback, why
    engine = choose_engine(rt.engine, rt.precision, rt.device)
    threads = rt.threads or available_cpus()
    text_engines = {e for e, _p in PRECISIONS}
    same = [
        c
        for c in candidates
        if ((c["engine"] == engine and c["precision"] == rt.precision) or c["engine"] not in text_engines)
        and c["passed"]
        and c["rows_per_s"]
    ]
    same = [c for c in same if c["threads"] == threads] or same
    if not same:
        return fallback, f"tune measured no passing {engine} {rt.precision} candidate; using {default}"
    best = max(same, key=lambda c: c["rows_per_s"])
    return int(best["batch_size"]), f"measured by bulkinfer tune: {best['rows_per_s']} rows/s, {path}"


def to_toml(cfg: JobConfig, header: str = "") -> str:
    """The config as TOML, one section per concern: the fields the job set and the ones tune
    chose, nothing left at its default (fields at None are omitted too)."""
    lines = [f"# {line}" for line in header.splitlines()]
    for section, values in cfg.model_dump(mode="json", exclude_unset=True).items():
        tables = values if isinstance(values, list) else [values]  # [[export]] is an array of tables
        for table in tables:
            lines.append(f"\n[[{section}]]" if isinstance(values, list) else f"\n[{section}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items() if v is not None)
    return "\n".join(lines).lstrip("\n") + "\n"
