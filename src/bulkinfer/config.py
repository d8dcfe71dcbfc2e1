"""Job configuration: one frozen pydantic model per concern under :class:`JobConfig`.

A job is read from TOML (``bulkinfer run job.toml``); CLI flags and ``--set key=value``
override it. Unknown fields are refused. Each field's docstring is its documentation
and is what ``bulkinfer run --help`` shows.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from .core.credentials import find_masked
from .core.errors import ConfigError

__all__ = [
    "CostConfig",
    "ExecutionConfig",
    "ExportConfig",
    "JobConfig",
    "ModelConfig",
    "PostgresExport",
    "RedisExport",
    "RuntimeConfig",
    "SinkConfig",
    "SourceConfig",
    "field_docs",
    "load_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class SourceConfig(_Section):
    paths: list[str] = Field(default_factory=list)
    """Input files: paths, directories, globs or fsspec URIs (file://, memory://, s3://...)."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options for the inputs' object store (s3: endpoint_url, key, secret, profile, client_kwargs...);
    empty: the store's usual configuration (AWS_* variables, a profile, an instance role). Never stored."""
    format: Literal["auto", "parquet", "csv", "jsonl", "delta", "iceberg", "openai-batch"] = "auto"
    """Input format; 'auto' picks it from each file's extension (a .jsonl file of OpenAI batch requests:
    openai-batch). delta: paths are Delta Lake tables; iceberg: paths are Iceberg table names in source.catalog."""
    id_column: str | None = None
    """Column that identifies a row; copied to the output and to error records. Optional."""
    shard_rows: int = Field(default=10_000, ge=1)
    """Target rows per shard, the unit of commit and resume (Parquet shards follow row groups)."""
    max_record_bytes: int = Field(default=64 << 20, ge=1)
    """A record longer than this (a JSONL, batch-file or CSV record; a columnar row's text and binary
    values in the columns read) is an error row naming its size; line formats never read it."""
    read_batch_rows: int = Field(default=4096, ge=1)
    """Rows per Arrow record batch read from the input."""
    column_types: dict[str, str] = Field(default_factory=dict)
    """Arrow types of input columns ({id = "string", price = "double"}); the others are the
    types the files start with, unified across files (int and double: double; else string)."""
    version: int | None = Field(default=None, ge=0)
    """Delta: the table version to read (default: the latest)."""
    snapshot_id: int | None = None
    """Iceberg: the snapshot to read (default: the current one)."""
    as_of: str | None = None
    """Delta or Iceberg: read the table as it was at this ISO 8601 time (2026-12-02T23:00:00Z)."""
    catalog: dict[str, Any] = Field(default_factory=dict)
    """Iceberg: the catalog's name and properties, as pyiceberg's load_catalog takes them
    ({name = "prod", type = "sql", uri = "sqlite:///cat.db", warehouse = "file:///wh"})."""
    previous: str | None = None
    """An earlier output of this job, written with input hashes (--incremental-from): rows whose id and
    input are unchanged take their results from it instead of being inferred."""

    @field_validator("column_types")
    @classmethod
    def _known_types(cls, value: dict[str, str]) -> dict[str, str]:
        from .core.schema import parse_type

        for name, type_name in value.items():
            try:
                parse_type(type_name)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return value


class ModelConfig(_Section):
    name: str = ""
    """The model: 'minilm' (bundled all-MiniLM-L6-v2), a sentence-transformers directory,
    a joblib/pickle file of an estimator, an .onnx file, an index written by `bulkinfer index` (kNN: top-k
    neighbours per row), or 'module:attr' naming your own adapter."""
    kind: Literal["auto", "text-embedding", "tabular", "onnx", "custom", "knn", "generate"] = "auto"
    """Adapter family; 'auto' infers it from the model name (a causal language model directory: generate)."""
    text_column: str | None = None
    """Column holding the text to embed (text models)."""
    feature_columns: list[str] = Field(default_factory=list)
    """Feature columns in model order (tabular models); default: the model's feature_names_in_."""
    max_seq_length: int | None = Field(default=None, ge=1)
    """Truncate texts to this many tokens; default: the model's own max_seq_length."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of the adapter: a custom adapter's constructor arguments; for .onnx models
    {inputs = {onnx_input = "column"}, outputs = {onnx_output = "column"}}."""
    prompt_template: str | None = None
    """Generation models: the prompt of each row, with {column} placeholders ("Summarise: {text}");
    default: the text column as it is."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Generation models: tokens generated per row at most (finish_reason = length when reached)."""
    stop: list[str] = Field(default_factory=list)
    """Generation models: a completion ends before the first of these strings (finish_reason = stop)."""
    temperature: float = Field(default=0.0, ge=0)
    """Generation models: 0 is greedy; above 0, sampling (each row with its own seed: see seed)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Generation models, sampling: draw from the smallest set of tokens whose probability reaches top_p."""
    seed: int = 0
    """Generation models, sampling: with the prompt, seeds each row's draws (a resumed row regenerates the same)."""
    messages: list[dict[str, str]] = Field(default_factory=list)
    """Generation models: chat messages ({role, content} with {column} placeholders) rendered by the tokenizer's
    chat template, instead of prompt_template."""
    chat_template: str | None = None
    """Generation models: a Jinja chat template replacing the tokenizer's own."""
    json_schema: dict[str, Any] | str | None = None
    """Generation models: every completion is JSON valid against this schema (an object, or a .json file's path):
    constrained decoding."""
    expand_json: bool = False
    """Generation models with json_schema: the JSON's top-level fields also become typed output columns."""
    ignore_eos: bool = False
    """Generation models: always generate max_new_tokens, EOS or not (benchmarks; as vLLM's ignore_eos)."""
    served_name: str | None = None
    """The model's name in OpenAI requests (body.model) and responses; default: the model directory's name."""


class RuntimeConfig(_Section):
    engine: Literal["auto", "torch", "onnxruntime", "vllm"] = "auto"
    """Inference engine for neural models: onnxruntime (exported once, cached on disk), torch, or auto:
    onnxruntime on CPU in fp32/int8, torch for bf16 and on GPUs. Generation models: transformers, or vllm
    (GPU; pip install bulkinfer[vllm])."""
    precision: Literal["fp32", "bf16", "fp16", "int8", "auto"] = "fp32"
    """fp32; bf16 (torch engine, CPUs with bf16 or GPUs from compute capability 8.0); fp16 (torch engine,
    GPUs); int8 (onnxruntime, per-channel weights); auto: the
    fastest precision whose quality gate passed in `bulkinfer tune`'s measurements for this model on this
    kind of machine (a short calibration on the job's rows the first time, kept), never one emulated here."""
    cache_dir: str | None = None
    """Where compiled models are cached; default $BULKINFER_CACHE or ~/.cache/bulkinfer."""
    int8_fp32_groups: list[str] | None = None
    """int8: the transformer's groups kept in fp32 (layer.0/output, layer.2/attention..., and
    "outlier-channels": each feed-forward block's largest channels); None: full int8, or when that fails the
    quality gate, the outlier channels then the fewest most-sensitive blocks that pass it, found on the job's
    rows and cached per model, machine kind and floor."""
    quality_floor: float = Field(default=0.99, ge=-1, le=1)
    """A lowered precision must keep the mean cosine to fp32 on the job's own rows at least this high."""
    quality_sample_rows: int = Field(default=512, ge=2)
    """Rows of the job's input the quality gate compares on (taken from across the input)."""
    device: str = "cpu"
    """Torch device: 'cpu', 'cuda', 'cuda:1'."""
    tensorrt: bool = False
    """onnxruntime on a GPU: run through ONNX Runtime's TensorRT execution provider (pip install
    onnxruntime-gpu tensorrt), precision fp32 or fp16; its engines are built once per GPU, precision and
    batch shape and cached under cache_dir."""
    batch_size: int | Literal["auto"] = 16
    """Maximum rows per model call; "auto": the fastest size `bulkinfer tune` measured for this
    model, engine and precision on this machine (when it has not been run: the model's own default,
    65536 for tabular models, else 16)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Token budget per model call (rows x padded length) for text models; None: rows only."""
    dedupe: bool | Literal["auto"] = False
    """Infer rows with identical model inputs once and fan the result out (auto: on when the first rows
    read hold at least 2% duplicates)."""
    dedupe_cache_rows: int = Field(default=100_000, ge=0)
    """Results kept for dedupe across windows of rows, by input hash (least recently used go first)."""
    sort_window: int = Field(default=2048, ge=1)
    """Rows sorted by length together to cut padding; order is restored before writing."""
    threads: int | None = Field(default=None, ge=1)
    """Intra-op threads; default: the CPUs this process may use (os.sched_getaffinity)."""
    prefetch_batches: int = Field(default=8, ge=1)
    """Bounded queue depth between reading/tokenizing and inference."""
    batch_timeout_s: float | None = Field(default=None, gt=0)
    """A model call running longer is abandoned and retried on smaller batches, then its rows fail."""

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError('expected a whole number >= 1 or "auto"')

    @field_validator("tensorrt")
    @classmethod
    def _tensorrt(cls, value: bool, info: ValidationInfo) -> bool:
        device, engine, precision = (info.data.get(k) for k in ("device", "engine", "precision"))
        if value and not str(device).startswith("cuda"):
            raise ValueError(
                f"TensorRT runs on an NVIDIA GPU, not runtime.device = {device}; set runtime.device = cuda, "
                "or runtime.tensorrt = false"
            )
        if value and (engine not in ("auto", "onnxruntime") or precision not in ("fp32", "fp16")):
            raise ValueError(
                f"TensorRT runs the onnxruntime engine in fp32 or fp16, not {engine}/{precision}; "
                "set runtime.precision = fp16 (or fp32), or runtime.tensorrt = false"
            )
        return value

    @property
    def rows_per_call(self) -> int:
        """``batch_size`` once "auto" has been resolved (``run_job`` does that first)."""
        if self.batch_size == "auto":
            raise ConfigError('runtime.batch_size = "auto" was not resolved; run the job through run_job')
        return self.batch_size


class SinkConfig(_Section):
    path: str = ""
    """Output directory: a local or shared-filesystem path (or file://); not an object-store URI."""
    format: Literal["parquet", "jsonl", "csv", "openai-batch", "delta"] = "parquet"
    """Output file format; openai-batch (the default for an openai-batch input): the Batch API's output lines;
    delta: the folder is a Delta Lake table, each part added in an idempotent commit."""
    keep_columns: list[str] = Field(default_factory=list)
    """Input columns copied to the output next to the results (the id column always is)."""
    preserve_order: bool = True
    """Keep input row order within each shard's output file."""
    compression: str = "zstd"
    """Parquet compression codec."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options of an object-store path (s3: endpoint_url, key, secret, profile, client_kwargs...)."""
    input_hash: bool = False
    """Write each row's input hash (_input_hash) beside its results, so a later run can be incremental
    from this output (always on in an incremental run)."""
    mode: Literal["snapshot", "delta"] = "snapshot"
    """snapshot: every row; delta (with source.previous): only new and changed rows, plus _deleted.parquet."""


class ExecutionConfig(_Section):
    backend: Literal["local", "ray"] = "local"
    """Where shards run: this process, or Ray actors (a local Ray instance or an existing cluster)."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``, ``host:6379``); None starts a local Ray instance."""
    workers: int | None = Field(default=None, ge=1)
    """Ray workers (actors); None: as many as the cluster's CPUs fit at ``num_cpus`` each."""
    num_cpus: float = Field(default=1.0, gt=0)
    """CPUs each Ray worker reserves; its model runs that many intra-op threads."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs each Ray worker reserves (fractions share a GPU)."""
    worker_timeout_s: float = Field(default=60.0, gt=0)
    """A Ray worker that answers no heartbeat for this long is presumed dead; its shard is re-queued."""
    split_min_rows: int = Field(default=512, ge=0)
    """Straggler split: when a worker is idle, a running shard with at least twice this many rows left
    gives half of them to it; 0 turns splitting off."""
    overwrite: bool = False
    """Discard an output directory that holds a different job instead of refusing."""
    progress: Literal["auto", "bar", "log", "none"] = "auto"
    """Progress display: a bar on a terminal, periodic log lines otherwise."""
    log_interval_s: float = Field(default=10.0, gt=0)
    """Seconds between progress log lines when not on a terminal."""
    limit_rows: int | None = Field(default=None, ge=1)
    """Process only the first N planned rows (a smoke test of a big job)."""
    max_error_rate: float = Field(default=0.001, ge=0, le=1)
    """Stop (exit 1) once failed rows exceed this share of the planned rows."""
    repair: bool = False
    """Rebuild a corrupt ledger (commits.log) from the part and error files before running."""
    max_errors: int | None = Field(default=None, ge=0)
    """Stop (exit 1) once failed rows exceed this count; None: only max_error_rate applies."""
    max_cost: float | None = Field(default=None, ge=0)
    """Stop cleanly (commit what is in flight, exit 1) once the run's projected cost passes this, in
    cost.currency (needs cost.instance or cost.instance_price_per_hour); a rerun resumes."""
    redact: bool = False
    """Keep input values out of error records, logs and reports (row number, id, stage and error type
    stay); serve withholds them from its answers too."""
    min_error_budget: int = Field(default=10, ge=0)
    """Failed rows allowed whatever the rate, up to half the planned rows, so one bad row never fails a small
    job (max_error_rate = 0 allows none)."""


class CostConfig(_Section):
    instance_price_per_hour: float = Field(default=0.0, ge=0)
    """Price of the machine per hour, for cost per million rows in the report (0: from ``instance``)."""
    instance: str | None = None
    """A known instance type (c7i.large, g5.xlarge...): its on-demand price comes from bulkinfer's price table."""
    currency: str = "USD"
    """Currency of the price."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels the run's cost is booked under ({team = "search", model = "minilm-v2"}): in the report, the
    metrics and ``bulkinfer costs``."""


class LineageConfig(_Section):
    url: str | None = None
    """An OpenLineage HTTP endpoint (Marquez: http://host:5000): START, COMPLETE, FAIL and ABORT run events."""
    endpoint: str = "api/v1/lineage"
    """The path events are POSTed to under ``url``."""
    file: str | None = None
    """Append the events to this file, one JSON object per line (beside or instead of ``url``)."""
    namespace: str = "bulkinfer"
    """The OpenLineage job namespace."""
    job_name: str | None = None
    """The OpenLineage job name (default: the output folder's name)."""
    timeout_s: float = Field(default=5.0, gt=0)
    """Seconds to wait for the receiver; a receiver that is down costs a warning, never the run."""


class MonitorConfig(_Section):
    baseline: str | None = None
    """An earlier run's output: this run's column statistics are compared with its stats.json (drift)."""
    max_psi: float = Field(default=0.25, ge=0)
    """A column whose population stability index against the baseline is over this has drifted."""
    fail_on_drift: bool = False
    """Exit 1 after committing when a column drifted (the output is kept; the pipeline stops)."""


class IndexConfig(_Section):
    output: str | None = None
    """Build a nearest-neighbour index here once the job completes (None: no index; see bulkinfer index)."""
    column: str = "embedding"
    """The vector column to index."""
    kind: Literal["flat", "hnsw", "ivf-pq"] = "hnsw"
    """flat (exact), hnsw, or ivf-pq (compressed)."""
    metric: Literal["cosine", "ip", "l2"] = "cosine"
    """Similarity of the index and of the recall check."""
    min_recall: float | None = Field(default=None, ge=0, le=1)
    """Refuse an index whose recall@10 against exact search is lower (the job fails; its output stays)."""


class ServeConfig(_Section):
    host: str = "127.0.0.1"
    """Address `bulkinfer serve` binds to (loopback unless told otherwise)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port of `bulkinfer serve` (0: any free port, printed at start)."""
    max_batch_size: int = Field(default=64, ge=1)
    """Dynamic batching: at most this many rows of concurrent requests are merged (and run in
    length-sorted calls of runtime.batch_size rows)."""
    max_wait_ms: float = Field(default=0.0, ge=0)
    """Dynamic batching: how long the first request of a batch waits for others to join it
    (0: merge only the requests that queued while the model was busy; no added latency)."""
    max_queue_rows: int = Field(default=1024, ge=1)
    """Rows waiting for the model beyond which requests get 503 with Retry-After instead of queueing."""
    max_rows_per_request: int = Field(default=256, ge=1)
    """A request with more rows gets 413."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """A request body larger than this gets 413."""
    api_keys_file: str | None = None
    """File with one API key per line; when set, requests need `Authorization: Bearer <key>`."""
    tls_cert: str | None = None
    """PEM certificate (chain) to serve HTTPS with (with serve.tls_key)."""
    tls_key: str | None = None
    """PEM private key of serve.tls_cert."""
    audit_log: str | None = None
    """Append one JSON line per request (time, key id — never the key —, route, rows, status, latency,
    client) to this file, rotated by size; "-" for stderr. Off by default."""
    audit_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    """Rotate the audit log past this size (five old files are kept)."""
    reload_s: float = Field(default=10.0, ge=0)
    """How often to look for a newer index (a kNN model) or a newer finished run (serve.results), and swap
    it in without dropping requests (0: never)."""
    results: str | None = None
    """GET /v1/results/{id} answers from: a finished Parquet run's folder, or redis://... (the current
    snapshot of the job's versioned [[export]] kind = "redis")."""


class RedisExport(_Section):
    kind: Literal["redis"] = "redis"
    url: str = "redis://127.0.0.1:6379/0"
    """Redis to write to (redis://[:password@]host:port/db, rediss:// for TLS)."""
    key: str = "bulkinfer:{id}"
    """Key of each row: text and {column} placeholders (output or kept input columns)."""
    columns: list[str] = Field(default_factory=list)
    """Output columns to store (default: every model output column)."""
    encoding: Literal["auto", "float32", "json", "hash"] = "auto"
    """auto: one vector column as float32 bytes, one scalar as text, several as a hash; json: one JSON object."""
    ttl_s: int | None = Field(default=None, ge=1)
    """Expire each key this many seconds after it is written (None: never)."""
    versioned: bool = True
    """Write under the run's own version and switch '<prefix>current' to it when the job completes."""
    keep_versions: int = Field(default=2, ge=1)
    """Published versions kept (the current one included); older ones are deleted after a switch."""
    batch_rows: int = Field(default=2000, ge=1)
    """Rows per pipelined round trip."""


class PostgresExport(_Section):
    kind: Literal["postgres"] = "postgres"
    dsn: str = ""
    """Connection string (postgresql://user:pass@host:port/db)."""
    table: str = "bulkinfer_results"
    """Table to write (schema.table allowed); created when missing."""
    mode: Literal["upsert", "append"] = "upsert"
    """upsert: one row per id (the id column is the primary key); append: rows are added."""
    columns: list[str] = Field(default_factory=list)
    """Output columns to store besides the kept input columns (default: every model output column)."""
    vector: Literal["auto", "pgvector", "array"] = "auto"
    """Embeddings as pgvector vector(n) (auto: when the extension can be used) or real[]."""


class RedisStreamExport(_Section):
    kind: Literal["redis_stream"] = "redis_stream"
    url: str = "redis://127.0.0.1:6379/0"
    """Redis to write to (redis://[:password@]host:port/db, rediss:// for TLS)."""
    stream: str = "bulkinfer:queue"
    """Stream key: each row is one entry (XADD), its kept input and chosen output columns as fields."""
    columns: list[str] = Field(default_factory=list)
    """Output columns of each entry besides the kept input columns (default: every model output column)."""
    maxlen: int | None = Field(default=None, ge=1)
    """Trim the stream to about this many entries (XADD MAXLEN ~); None: never."""


class FolderExport(_Section):
    kind: Literal["folder"] = "folder"
    path: str = ""
    """Folder or object-store prefix; each committed part's rows are written there under the part's name."""
    format: Literal["parquet", "jsonl", "csv"] = "parquet"
    """File format of the folder's parts."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options when path is an object-store URI."""


ExportConfig = Annotated[
    Union[RedisExport, PostgresExport, RedisStreamExport, FolderExport],  # noqa: UP007
    Field(discriminator="kind"),
]
EXPORT_KINDS = (RedisExport, PostgresExport, RedisStreamExport, FolderExport)


class RouteConfig(_Section):
    name: str
    """Route name (letters, digits, _ and -): the report counts its rows under it."""
    when: str
    """Expression over the output columns (comparisons, and/or/not, arithmetic, is null, in); first match wins."""
    export: list[ExportConfig] = Field(min_length=1)
    """Where the route's rows go ([[route.export]] tables, any export kind); not to the output folder."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", v) or v == "default":
            raise ValueError(f"{v!r}: use letters, digits, _ and - ('default' is the rows no route takes)")
        return v

    @field_validator("when")
    @classmethod
    def _when(cls, v: str) -> str:
        from .core.expr import parse

        try:
            parse(v, "when")  # refused here, with the token and its position
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("when: ")) from None
        return v


class JobConfig(_Section):
    source: SourceConfig = Field(default_factory=SourceConfig)
    """Where the rows come from."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """What model runs over them."""
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

    @property
    def passthrough_columns(self) -> list[str]:
        """Input columns copied to the output: the id column and ``sink.keep_columns``, once each."""
        return list(dict.fromkeys(c for c in [self.source.id_column, *self.sink.keep_columns] if c))

    def require_runnable(self) -> None:
        """Refuse a config that cannot run, naming the missing field."""
        if not self.source.paths:
            raise ConfigError("source.paths: no input given; pass --input or set source.paths")
        if not self.model.name:
            raise ConfigError("model.name: no model given; pass --model (e.g. --model minilm)")
        if not self.sink.path:
            raise ConfigError("sink.path: no output directory given; pass --output or set sink.path")
        scheme, sep, _ = self.sink.path.partition("://")
        if sep and scheme != "file":
            import fsspec

            if scheme not in fsspec.available_protocols():
                raise ConfigError(f"sink.path: {self.sink.path}: no filesystem knows {scheme}:// (fsspec has none)")


def _format_validation_error(exc: ValidationError, origin: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field (see `bulkinfer run --help` for the fields)"
    elif "input" in err and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{origin}: {loc}: {msg}{more}"


def parse_value(text: str) -> Any:
    """Parse a ``--set`` value as a TOML value, falling back to a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    sets: list[str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> JobConfig:
    """Build a :class:`JobConfig` from ``base`` or a TOML file, then dotted-key overrides, then ``k=v`` strings."""
    data: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (base or {}).items()}
    origin = "config"
    if path is not None:
        origin = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"{path}: config file not found") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set runtime.batch_size=64")
        _set_dotted(data, key.strip(), parse_value(raw.strip()))
    if base is not None and path is None and (masked := find_masked(data)) is not None:
        raise ConfigError(
            f"{masked}: the output's job.json keeps no credentials; rerun with the job file that holds it (-c)"
        )
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, origin)) from exc


def field_docs() -> Iterator[tuple[str, str, str]]:
    """Yield (dotted name, default, doc) for every leaf field, for help texts and the README."""
    for section, info in JobConfig.model_fields.items():
        if section == "export":
            kinds = ", ".join(t.model_fields["kind"].default for t in EXPORT_KINDS)
            yield "export.kind", "(required)", f"Which target this [[export]] table is: {kinds}; its fields follow."
            for target in EXPORT_KINDS:
                for name, field in target.model_fields.items():
                    if name != "kind":
                        doc = " ".join((field.description or "").split())
                        kind = target.model_fields["kind"].default
                        yield f"export.{name}", repr(field.get_default(call_default_factory=True)), f"({kind}) {doc}"
            continue
        if section == "route":
            for name, field in RouteConfig.model_fields.items():
                default = "[]" if name == "export" else "(required)"
                yield f"route.{name}", default, " ".join((field.description or "").split())
            continue
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            default = field.get_default(call_default_factory=True)
            doc = " ".join((field.description or "").split())
            yield f"{section}.{name}", repr(default), doc
