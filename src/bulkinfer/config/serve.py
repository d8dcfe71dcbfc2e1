"""``[serve]``: the HTTP server over the same adapter."""

from __future__ import annotations

from pydantic import Field

from .section import Section


class ServeConfig(Section):
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
    max_image_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """Picture models: one picture (an upload, or base64 in JSON) larger than this gets 413; its pixels are
    limited by source.max_image_pixels (over it: 400)."""
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
    features: bool = False
    """A Feast-sourced job (source.kind = "feast"): requests carry only the entity key and the model gets the
    entity's features from the online store (get_online_features) instead of as of a timestamp sent;
    POST /v1/predict?features=true adds each row's feature values to the answer."""
    results: str | None = None
    """GET /v1/results/{id} answers from: a finished Parquet run's folder, or redis://... (the current
    snapshot of the job's versioned [[export]] kind = "redis")."""
    batches: str | None = None
    """A folder for the batch service (`--batches`): POST /v1/files and /v1/batches accept OpenAI Batch
    jobs, kept there (uploads, batch records, each batch's output) so a restart resumes them."""
    batch_concurrency: int = Field(default=1, ge=1)
    """Batches run at once; the others wait in order of creation."""
    batch_step_ms: float = Field(default=25.0, gt=0)
    """While online requests come in, a batch calls the model in steps of about this long (an online
    request waits at most about one step); the steps grow back to whole calls when online traffic stops."""
    batch_shard_rows: int = Field(default=1000, ge=1)
    """Requests per commit of a batch: request_counts move, and a crash re-runs at most this many."""
    batch_window_s: float | None = Field(default=None, gt=0)
    """Seconds a batch's completion_window lasts (unset: what it says, 24h); past it the batch expires."""
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1)
    """The largest file POST /v1/files accepts (OpenAI's limit: 200 MB)."""
    max_batch_requests: int = Field(default=50_000, ge=1)
    """The most requests one batch file may hold (OpenAI's limit: 50,000)."""
    webhook_url: str | None = None
    """Where batch events (batch.completed, .failed, .expired, .cancelled) are POSTed, signed as the
    Standard Webhooks spec says with serve.webhook_secret; retried with backoff while the receiver is down."""
    webhook_secret: str | None = None
    """The Standard Webhooks secret (whsec_<base64>) the events are signed with."""
