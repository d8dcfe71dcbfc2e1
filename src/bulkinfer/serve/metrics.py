"""The server's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from .batches import BatchQueue
    from .share import ModelShare

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
        self.batches = Gauge("bulkinfer_batches", "Batches of the batch service by status", ["status"], registry=r)
        self.batch_answers = Gauge(
            "bulkinfer_batch_requests", "Batch requests this process ran, by outcome", ["outcome"], registry=r
        )
        self.batch_rows_per_s = Gauge(
            "bulkinfer_batch_rows_per_second", "Requests/s of the running batches", registry=r
        )
        self.batch_yielded = Gauge(
            "bulkinfer_batch_yielded_seconds", "Seconds batch work waited for online requests", registry=r
        )

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_batch(self, rows: int, requests: int) -> None:
        self.batch_rows.observe(rows)
        self.batch_requests.observe(requests)

    def observe_batches(self, queue: BatchQueue, share: ModelShare) -> None:
        for status, n in queue.counts().items():
            self.batches.labels(status).set(n)
        self.batch_answers.labels("answered").set(queue.answered)
        self.batch_answers.labels("failed").set(queue.failed)
        self.batch_rows_per_s.set(queue.rows_per_s())
        self.batch_yielded.set(share.yielded_s)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
