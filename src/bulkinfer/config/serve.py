"""``[serve]``: the HTTP server over the same adapter."""

from __future__ import annotations

from pydantic import Field

from .base import Section


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
