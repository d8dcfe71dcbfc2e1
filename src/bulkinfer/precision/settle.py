"""The settle step: every automatic or derived setting of a job is decided here, once, and
nowhere else rewrites the job's config.

::

    settled = settle(cfg)                  # bulkinfer run (job.prepare), Python API
    settled = settle(cfg, online=True)     # bulkinfer serve
    cfg = with_column_types(cfg, types)    # the plan's settled column types, for every reader
    cfg = after_gate(cfg, figures)         # what the quality gate chose (int8 groups) for the workers
    cfg = for_workers(cfg, out, cpus)      # a cluster's workers: the output's absolute path, their CPUs
    cfg = on_a_worker(cfg)                 # a task on a worker runs locally there

In order, :func:`settle` decides:

1. an OpenAI batch input (declared, or ``.jsonl`` files of requests): ``custom_id`` as the id
   column, the Batch output format (:func:`_batch_file`) and, unless
   the job sets a budget, no error budget (a bad line is its request's answer); online, a
   generation model's requests are rows of that request mode;
2. the model (:func:`bulkinfer.adapters.resolve_model`);
3. ``runtime.precision = "auto"``: the engine and precision the run being resumed chose, else
   the fastest gate-passing one ``tune`` measured (or calibrates) for this model on this
   machine kind; on a Ray driver without the job's device, ``on_cluster`` decides it on a
   worker (the caller passes how: this package does not import the runners);
4. the adapter, built (not set up) for that precision, with its int8 groups and TensorRT profile;
5. ``runtime.batch_size``: "auto" is what ``tune`` measured, unset is the adapter's hint;
6. ``sink.input_hash``: unset, on for a Parquet output with an id column (what a later
   ``--incremental-from`` needs), or what the run being resumed chose;
7. ``--incremental-from``: a previous output whose results cannot stand for this job's
   (another model or setting) turns into a full run that still writes input hashes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..adapters import Adapter, ResolvedModel, build_adapter, resolve_model
from ..config import JobConfig
from ..core import hardware
from ..core.errors import BulkinferError, ConfigError
from ..core.storage import storage_options_for
from ..finished.previous import check_previous, check_reusable
from ..finished.read import private_json
from ..llm.batch_files import batch_inputs
from ..plan import job_identity
from .tune import auto_batch_size, auto_precision

__all__ = ["OnCluster", "Settled", "after_gate", "for_workers", "on_a_worker", "settle", "with_column_types"]

log = logging.getLogger("bulkinfer")

OnCluster = Callable[[JobConfig], tuple[str, str, str]]
"""``(engine, precision, why)`` for ``runtime.precision = "auto"``, decided on a worker of the
cluster (a Ray driver on a CPU node has no GPU to read or calibrate on)."""


@dataclass(frozen=True)
class Settled:
    """The job's config with every setting concrete, its model, and the (not yet set up) adapter."""

    cfg: JobConfig
    model: ResolvedModel
    adapter: Adapter


def settle(cfg: JobConfig, *, online: bool = False, on_cluster: OnCluster | None = None) -> Settled:
    """Decide every automatic or derived setting of ``cfg`` (see the module's docstring).
    ``online``: for ``serve`` (no resume, no incremental input, no batch file to detect)."""
    if not online:
        cfg = _batch_budget(_batch_file(cfg))
    model = resolve_model(cfg)
    if model.kind == "remote-batch":
        cfg = _remote_shards(cfg)
    if online and model.kind == "generate":  # requests are rows of the adapter's request mode, as in a batch file
        cfg = _update(cfg, "source", format="openai-batch")
    if online and model.kind == "text-embedding" and cfg.model.truncate is None:
        cfg = _update(cfg, "model", truncate=False)  # a request over the token limit is a 400, as the API has it
    if online and model.kind == "text-embedding" and not cfg.model.text_column:
        log.info("no --text-column: /v1/predict rows carry their text in 'input' (/v1/embeddings needs none)")
        cfg = _update(cfg, "model", text_column="input")
    started = None if online or cfg.execution.overwrite else _started(cfg, model)
    if cfg.runtime.precision == "auto" and started:
        cfg = _as_resumed(cfg, started)
    cfg = _precision(cfg, model, on_cluster)
    adapter = build_adapter(cfg, model, online)
    cfg = _batch_size(cfg, model.digest, adapter)
    if not online:
        cfg = _input_hash(cfg, model, started)
    if cfg.source.previous and not online:
        cfg = _incremental(cfg, model)
    return Settled(cfg, model, adapter)


def _remote_shards(cfg: JobConfig) -> JobConfig:
    """A shard's requests go into one remote batch file, which holds ``model.batch_max_requests``
    at most: shards are cut no larger (``source.shard_rows`` lowered to it when left at its
    default, refused when set above it), so no file breaks the limit."""
    limit, rows = cfg.model.batch_max_requests, cfg.source.shard_rows
    if rows <= limit:
        return cfg
    if "shard_rows" in cfg.source.model_fields_set:
        raise ConfigError(
            f"source.shard_rows = {rows} is over model.batch_max_requests = {limit}: a shard's requests go into one "
            f"batch file; set source.shard_rows to {limit} or less"
        )
    log.info("source.shard_rows = %d: a remote batch file holds model.batch_max_requests requests at most", limit)
    return _update(cfg, "source", shard_rows=limit)


def _started(cfg: JobConfig, model: ResolvedModel) -> dict[str, Any] | None:
    """The plan (job.json) of the run of this model that began the output, if one did; an
    output that cannot be read here is left to the resume to judge."""
    try:
        with storage_options_for(cfg.sink.storage_options, [cfg.sink.path]):
            started = private_json(cfg.sink.path, "job.json")
    except (BulkinferError, OSError, ValueError):
        return None
    return started if started and started.get("model_digest") == model.digest else None


def _input_hash(cfg: JobConfig, model: ResolvedModel, started: Mapping[str, Any] | None) -> JobConfig:
    """A concrete ``sink.input_hash``: unset, input hashes are written whenever a later run
    could be incremental from this output (an id column and Parquet; not a remote Batch API's),
    except that an output a run already ``started`` keeps that run's choice, so an output begun
    without them (by an older version) resumes as the same job."""
    if cfg.sink.input_hash is not None:
        return cfg
    on = bool(cfg.source.id_column) and cfg.sink.format == "parquet" and model.kind != "remote-batch"
    if started:
        on = bool((started.get("identity") or {}).get("sink.input_hash"))
    return _update(cfg, "sink", input_hash=on)


def _batch_budget(cfg: JobConfig) -> JobConfig:
    """An OpenAI batch file's bad lines are answers too (its error file), as the Batch API has it:
    a bad line fails only its own request, whatever their share, unless the job sets a budget."""
    budget = {"max_error_rate", "max_errors", "min_error_budget"}
    if cfg.source.format != "openai-batch" or budget & cfg.execution.model_fields_set:
        return cfg
    log.info(
        "OpenAI batch file: a bad line fails only its own request (set execution.max_error_rate to stop at a share)"
    )
    return _update(cfg, "execution", max_error_rate=1.0)


def after_gate(cfg: JobConfig, figures: Mapping[str, Any] | None) -> JobConfig:
    """``cfg`` with what the quality gate chose: the int8 groups its search kept in fp32, which
    every worker builds its model with (unchanged when the gate kept none)."""
    groups = (figures or {}).get("int8_fp32_groups")
    return _update(cfg, "runtime", int8_fp32_groups=groups) if groups else cfg


def with_column_types(cfg: JobConfig, types: Mapping[str, str] | None) -> JobConfig:
    """``cfg`` whose readers convert to the plan's settled column types (``types``)."""
    return _update(cfg, "source", column_types=dict(types or {}))


def for_workers(cfg: JobConfig, out: str, cpus: int | None = None) -> JobConfig:
    """``cfg`` as a cluster's workers get it: the output at ``out`` (absolute: they write to the
    same output whatever their working directory) and, when the cluster says, each task's CPUs
    (a task's model runs as many intra-op threads)."""
    cfg = _update(cfg, "sink", path=out)
    return _update(cfg, "execution", num_cpus=float(cpus)) if cpus is not None else cfg


def on_a_worker(cfg: JobConfig) -> JobConfig:
    """``cfg`` for a task that runs on a cluster's worker: in that process (``backend = local``)."""
    return _update(cfg, "execution", backend="local")


def _batch_file(cfg: JobConfig) -> JobConfig:
    """``cfg`` for an OpenAI batch input (declared, or detected: ``.jsonl`` files whose first
    line is a request): ``custom_id`` is the id column and, unless another was chosen, the
    output is in the Batch output format."""
    fmt = cfg.source.format
    if fmt == "auto" and batch_inputs(cfg.source.paths):
        fmt = "openai-batch"
    if fmt != "openai-batch":
        return cfg
    if cfg.source.id_column not in (None, "custom_id"):
        raise ConfigError("source.id_column: an OpenAI batch file's requests are identified by custom_id; drop it")
    cfg = _update(cfg, "source", format=fmt, id_column="custom_id")
    return cfg if "format" in cfg.sink.model_fields_set else _update(cfg, "sink", format=fmt)


def _update(cfg: JobConfig, section: str, **fields: Any) -> JobConfig:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=fields)})


def _as_resumed(cfg: JobConfig, started: Mapping[str, Any]) -> JobConfig:
    """``runtime.precision = "auto"`` on an output a run of this model already ``started``: the
    engine and precision that run chose, so a ``tune`` in between (or another machine kind)
    does not turn the resume into a changed job. Anything else that differs is refused by the
    resume as usual."""
    chosen = (started.get("config") or {}).get("runtime") or {}
    if chosen.get("precision") in (None, "auto") or not chosen.get("engine"):
        return cfg
    keep = {k: chosen[k] for k in ("engine", "precision", "int8_fp32_groups") if k in chosen}
    log.info(
        "runtime.precision = auto: %s on %s, as chosen by the run this one resumes (%s)",
        keep["precision"], keep["engine"], cfg.sink.path,
    )  # fmt: skip
    return _update(cfg, "runtime", **keep)


def _precision(cfg: JobConfig, model: ResolvedModel, on_cluster: OnCluster | None) -> JobConfig:
    """A concrete ``runtime.precision`` (and engine): "auto" becomes the fastest gate-passing
    precision measured for the model on this machine kind; fp32 for models precisions do not
    apply to."""
    rt = cfg.runtime
    if rt.precision != "auto":
        return cfg
    engine: str
    if model.kind != "text-embedding":
        engine, precision, why = rt.engine, "fp32", f"precisions apply to text models, this one is {model.kind}"
    elif cfg.execution.backend == "ray" and not hardware.device_here(rt.device):  # a Ray driver on a CPU node
        if on_cluster is None:
            raise ConfigError(
                f'runtime.precision = "auto": runtime.device = {rt.device} is not on this machine and no cluster '
                "was given to decide it on; set runtime.precision"
            )
        engine, precision, why = on_cluster(cfg)
    else:
        engine, precision, why = auto_precision(cfg, model)
    log.info("runtime.precision = auto: %s on %s (%s)", precision, engine, why)
    return _update(cfg, "runtime", precision=precision, engine=engine)


def _batch_size(cfg: JobConfig, model_digest: str, adapter: Adapter) -> JobConfig:
    """A concrete ``runtime.batch_size``: "auto" becomes what ``tune`` measured, and a size left
    unset becomes the adapter's hint (large for cheap tabular models)."""
    if cfg.runtime.batch_size == "auto":
        size, why = auto_batch_size(cfg, model_digest, adapter.batch_size_hint)
        log.info("runtime.batch_size = auto: %d (%s)", size, why)
        return _update(cfg, "runtime", batch_size=size)
    if "batch_size" not in cfg.runtime.model_fields_set and adapter.batch_size_hint:
        return _update(cfg, "runtime", batch_size=adapter.batch_size_hint)
    return cfg


def _incremental(cfg: JobConfig, model: ResolvedModel) -> JobConfig:
    """``--incremental-from``: check the previous output; when its results cannot stand for this
    job's (another model or setting), run every row (still writing input hashes) and say why."""
    previous = cfg.source.previous
    assert previous is not None
    prev_job = check_previous(previous, cfg.source.id_column, cfg.sink.format)
    why = check_reusable(prev_job, job_identity(cfg), model.digest)
    if why is None:
        return cfg
    log.warning("--incremental-from %s: nothing can be reused: %s; every row is inferred", previous, why)
    cfg = _update(cfg, "sink", input_hash=True, mode="snapshot")
    return _update(cfg, "source", previous=None)
