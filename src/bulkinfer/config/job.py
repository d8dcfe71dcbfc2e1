"""The whole job: one section per concern."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field, field_validator

from ..core.errors import ConfigError
from .ensemble import DecisionConfig, MemberConfig, check_member_name
from .execution import ExecutionConfig
from .exports import (
    ExportConfig,
    RouteConfig,
)
from .model import ModelConfig
from .moderation import ModerationConfig
from .operations import CostConfig, IndexConfig, LineageConfig, MetricsConfig, MonitorConfig
from .runtime import RuntimeConfig
from .section import Section
from .serve import ServeConfig
from .sink import SinkConfig
from .source import SourceConfig


class JobConfig(Section):
    source: SourceConfig = Field(default_factory=SourceConfig)
    """Where the rows come from."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """What model runs over them."""
    models: dict[str, MemberConfig] = Field(default_factory=dict)
    """Several models over the same input ([models.<name>] tables, each with [model]'s fields): each
    writes its columns as <name>.<column> and may read another's (docs/ensembles.md). Instead of [model]."""
    decision: DecisionConfig | None = None
    """With [models]: the rules that write each row's `decision` column (routes then act on it)."""
    moderation: ModerationConfig | None = None
    """`serve`'s POST /v1/moderations: OpenAI's categories, each a score over the models' columns and a threshold."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """How the model runs."""
    sink: SinkConfig = Field(default_factory=SinkConfig)
    """Where results go."""
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    """How the job is driven."""
    cost: CostConfig = Field(default_factory=CostConfig)
    """Cost accounting."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Output statistics compared with a baseline run (drift)."""
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    """The run's metrics while it runs: a scrape port, a Pushgateway, the deadline alerts compare with."""
    lineage: LineageConfig = Field(default_factory=LineageConfig)
    """OpenLineage run events."""
    serve: ServeConfig = Field(default_factory=ServeConfig)
    """`bulkinfer serve`: the HTTP server over the same adapter."""
    index: IndexConfig = Field(default_factory=IndexConfig)
    """An index built from the output when the job completes ([index] section)."""
    export: list[ExportConfig] = Field(default_factory=list)
    """Export targets written with each shard before its commit ([[export]] tables: kind = redis | postgres |
    redis_stream | folder)."""
    route: list[RouteConfig] = Field(default_factory=list)
    """Routes ([[route]] tables): rows matching a route's `when` go to its targets instead of the output."""

    @field_validator("route")
    @classmethod
    def _unique_routes(cls, v: list[RouteConfig]) -> list[RouteConfig]:
        names = [r.name for r in v]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"two routes are named {dup!r}")
        return v

    @field_validator("models")
    @classmethod
    def _member_names(cls, v: dict[str, MemberConfig]) -> dict[str, MemberConfig]:
        for name in v:
            try:
                check_member_name(name)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @property
    def passthrough_columns(self) -> list[str]:
        """Input columns copied to the output: the id column, a video frame's video and time, a grid
        tile's cells (``<dim>_start``, ``<dim>_stop``), a Feast entity row's timestamp, and
        ``sink.keep_columns``, once each."""
        video = ["video_id", "timestamp_s", "frame_index"] if self.source.format == "video" else []
        tiles = [f"{d}_{end}" for d in self.source.tile for end in ("start", "stop")]  # a grid tile's cells
        when = [self.source.timestamp_column] if self.source.kind == "feast" else []  # the features' as-of time
        kept = [self.source.id_column, *video, *tiles, *when, *self.sink.keep_columns]
        return list(dict.fromkeys(c for c in kept if c))

    def refuse_unrendered(self) -> None:
        """Refuse a setting that still holds a scheduler's template (``{{ ds }}``): the scheduler
        did not render it, and run as is it would write every night into one folder named after
        the template (the second night finding its rows "already committed")."""
        for key, value in _strings(self.model_dump(mode="json", exclude=_HOLD_TEMPLATES)):
            if "{{" in value or "}}" in value:
                shown = "" if any(w in key.lower() for w in _SECRET_WORDS) else f" = {value!r}"
                raise ConfigError(
                    f"{key}{shown}: holds a template the scheduler did not render ({{{{ ... }}}}); render it "
                    "where the scheduler renders (an Airflow operator's template fields, once: not params inside "
                    "params) or pass the value itself"
                )

    def require_runnable(self) -> None:
        """Refuse a config that cannot run, naming the missing field."""
        self.refuse_unrendered()
        if not self.source.paths:
            raise ConfigError("source.paths: no input given; pass --input or set source.paths")
        self._one_kind_of_model()
        if not self.sink.path:
            raise ConfigError("sink.path: no output directory given; pass --output or set sink.path")
        scheme, sep, _ = self.sink.path.partition("://")
        if sep and scheme != "file":
            import fsspec

            if scheme not in fsspec.available_protocols():
                raise ConfigError(f"sink.path: {self.sink.path}: no filesystem knows {scheme}:// (fsspec has none)")
        self._top_k_fits()

    def _one_kind_of_model(self) -> None:
        if self.models and self.model.name:
            raise ConfigError("model.name: a job runs [model] or [models.<name>] tables, not both; move it into one")
        if not self.models and not self.model.name:
            raise ConfigError("model.name: no model given; pass --model (e.g. --model minilm)")
        if self.decision is not None and not self.models:
            raise ConfigError(
                "decision: rules over several models' columns need [models.<name>] tables; a [model] job routes "
                "on its own columns with [[route]] when = ..."
            )

    def _top_k_fits(self) -> None:
        """``sink.top_k`` ranks ties by the id and rewrites the finished parts: refuse what it cannot honour."""
        if self.sink.top_k is None:
            return
        refusals = [
            (not self.source.id_column,
             "needs source.id_column (ties are broken by it, and the best K must name their rows)"),
            (self.sink.format in ("delta", "openai-batch", "zarr"),
             f"cannot rank a {self.sink.format} output's rows; use sink.format parquet, jsonl or csv"),
            (self.sink.mode == "delta", "an incremental output (sink.mode = delta) holds only the changed rows, "
             "not a ranking of every row; drop one of them"),
            (bool(self.export or self.route), "[[export]] and [[route]] targets get each shard's rows, not the job's "
             "best K; export the finished output in a second job over it"),
        ]  # fmt: skip
        for refused, why in refusals:
            if refused:
                raise ConfigError(f"sink.top_k: {why}")


_TEMPLATES = {"prompt_template": True, "messages": True, "chat_template": True}
_HOLD_TEMPLATES: dict[str, Any] = {"model": _TEMPLATES, "models": {"__all__": _TEMPLATES}}
"""Settings that are templates of their own (a prompt's placeholders, a Jinja chat template)."""
_SECRET_WORDS = ("key", "secret", "password", "token", "storage_options")


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a dumped config, with its dotted key (``export[0].url``)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{key}[{i}]")
