"""The server's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServeMetrics"]

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServeMetrics:
    """Requests, latency, merged batch sizes, queue depth and refusals."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "bulkinfer_serve_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "bulkinfer_serve_request_seconds", "Time to answer a request", ["endpoint"], registry=r
        )
        self.batch_rows = Histogram(
            "bulkinfer_serve_batch_rows", "Rows per model call after merging", buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "bulkinfer_serve_batch_requests", "Requests merged into one model call", buckets=_BATCH_BUCKETS, registry=r
        )
        self.queue_rows = Gauge("bulkinfer_serve_queue_rows", "Rows waiting for the model", registry=r)
        self.rejected = Counter("bulkinfer_serve_rejected", "Requests refused with 503 (queue full)", registry=r)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_batch(self, rows: int, requests: int) -> None:
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
