"""The server's state: the settled job, the model and its batcher (set up in the background:
``/readyz`` turns 200 when it is loaded), the API keys and audit log, and precomputed results
swapped in while it runs. The routes (``app``) read it; nothing else owns it."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..adapters import Adapter, RowsRejected, job_setup_context, served_names
from ..adapters.feast import FeastFed
from ..adapters.moderation_requests import category_kinds
from ..config import JobConfig
from ..core.errors import BulkinferError, ConfigError
from ..core.locks import try_lock
from ..core.records import withheld
from ..precision.settle import settle
from .audit import AuditLog
from .auth import KeyRing
from .batch_jobs import ENDPOINTS, batch_model
from .batcher import Answer, Batcher, Overloaded, measure_call_overhead
from .batches import BatchQueue
from .files import FileStore
from .metrics import ServeMetrics
from .results import ResultIndex
from .share import ModelShare
from .webhooks import Webhooks

if TYPE_CHECKING:
    from .redis_results import RedisResults
from ..core.threads import thread
from .validation import ApiError, check_rows

__all__ = ["Server"]

log = logging.getLogger("bulkinfer")


class Server:
    """The model, its batcher and what the routes share."""

    def __init__(self, cfg: JobConfig) -> None:
        self.started_at = time.time()  # the served model's ``created`` (GET /v1/models)
        self.cfg = cfg
        self.sv = cfg.serve
        self.keys = KeyRing(self.sv.api_keys_file)
        self.audit = AuditLog(self.sv.audit_log, self.sv.audit_max_bytes)
        settled = settle(cfg, online=True)
        cfg = self.cfg = settled.cfg
        self.model, self.adapter = settled.model, settled.adapter
        self.model_names = served_names(cfg, self.model)  # what an OpenAI request's model may say
        self.passthrough = [c for c in cfg.passthrough_columns if c not in self.adapter.input_columns]
        if self.adapter.picture_column is not None and "id" not in self.passthrough:
            self.passthrough.insert(0, "id")  # a picture's answer names it: its file name, or the id sent
        self.moderation_kinds = category_kinds(cfg, self.adapter) if cfg.moderation is not None else None
        self.metrics = ServeMetrics()
        self.batcher: Batcher | None = None
        self.setup_error: str | None = None
        self.name = self.model_names[0]
        self.results = _results(self.sv.results, cfg) if self.sv.results else None
        if self.results is not None:
            log.info("precomputed results: %s", self.results.describe())
        # online first: batch work takes the model in steps while online requests wait
        self.share = ModelShare(step_s=self.sv.batch_step_ms / 1000.0)
        self.files: FileStore | None = None
        self.batches: BatchQueue | None = None
        self._batch_model: Adapter | None = None
        if self.sv.batches:
            self._open_batches(Path(self.sv.batches).expanduser())

    def _open_batches(self, root: Path) -> None:
        """The batch service over ``root`` (serve.batches): its files, queue and webhooks."""
        if self.model.kind == "ensemble" and self.moderation_kinds is None:
            raise ConfigError(
                "serve.batches: batches over several models are /v1/moderations batches; give the job a "
                "[moderation] section (its categories' scores)"
            )
        if self.model.kind not in ENDPOINTS:
            raise ConfigError(
                f"serve.batches: the Batch API answers {', '.join(e for es in ENDPOINTS.values() for e in es)}; "
                f"this {self.model.kind} model answers POST /v1/predict (run a batch of rows with bulkinfer run)"
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"serve.batches: cannot create {root} ({exc.strerror or exc})") from exc
        self._state_lock = _lock_state(root)
        self.files = FileStore(root)
        self.webhooks = Webhooks(self.sv.webhook_url, self.sv.webhook_secret, root)
        self.batches = BatchQueue(
            self.cfg, root, self.files, lambda: self._batch_model, audit=self.audit, webhooks=self.webhooks
        )

    def start(self) -> None:
        """Set the model up in the background; /readyz turns 200 when it is loaded."""
        thread(self._setup, name="bulkinfer-setup").start()
        if self.sv.reload_s > 0:
            thread(self._watch, name="bulkinfer-reload").start()
        if self.batches is not None:
            self.webhooks.start()
            self.batches.start()

    def close(self) -> None:
        """Stop: running batches commit what is in flight (they resume on the next start)."""
        if self.batches is not None:
            self.batches.close()
            self.webhooks.close()
        if self.batcher is not None:
            self.batcher.close()

    def _watch(self) -> None:
        """Swap in a newer index or finished run: built aside, then one assignment, so requests in
        flight finish on the old one and none is dropped."""
        while True:
            time.sleep(self.sv.reload_s)
            try:
                reload = getattr(self.adapter, "reload", None)
                if self.batcher is not None and reload is not None and reload():
                    log.info("swapped in the new index %s", self.name)
                newer = self.results.newer() if isinstance(self.results, ResultIndex) else None
                if newer is not None:
                    self.results = newer
                    log.info("swapped in the newer results: %s", newer.describe())
            except BulkinferError as exc:  # keep answering from what is loaded
                log.error("could not swap in the new version: %s", exc)

    def _setup(self) -> None:
        rt = self.cfg.runtime
        try:
            self.adapter.setup(job_setup_context(self.cfg, online=True))
            overhead = None
            if self.model.kind == "text-embedding":
                sample = pa.table({self.adapter.input_columns[0]: ["a short text of some words"] * 16})
                overhead = measure_call_overhead(self.adapter, sample)
                log.info("one model call costs as much as %.0f tokens (merged requests are cut by it)", overhead)
            self.batcher = Batcher(
                self.adapter,
                max_rows=self.sv.max_batch_size,
                batch_size=rt.rows_per_call,
                call_overhead=overhead,
                max_wait_s=self.sv.max_wait_ms / 1000.0,
                max_queue_rows=self.sv.max_queue_rows,
                on_batch=self.metrics.observe_batch,
                share=self.share,
            )
            if self.batches is not None:
                moderation = (self.cfg.moderation, self.moderation_kinds) if self.moderation_kinds is not None else None
                self._batch_model = batch_model(self.model.kind, self.adapter, self.model_names, self.share, moderation)
            log.info("model loaded: %s", self.name)
        except BulkinferError as exc:
            self.setup_error = str(exc)
            log.error("model set-up failed: %s", exc)

    def ready_batcher(self) -> Batcher:
        if self.batcher is None:
            why = f"model set-up failed: {self.setup_error}" if self.setup_error else "the model is still loading"
            raise ApiError(503, why, "unavailable", {"Retry-After": "1"})
        return self.batcher

    def check_rows(self, rows: Any) -> pa.Table:
        return check_rows(
            rows, self.adapter.input_columns, self.model.kind, self.passthrough, self.sv.max_rows_per_request
        )

    async def infer(self, table: pa.Table, rows: str = "rows") -> Answer:
        """The model's answer for ``table``'s rows; a row the model refuses is a 400 naming it
        (``rows``: what the request calls its rows, ``input`` for /v1/embeddings)."""
        batcher = self.ready_batcher()
        try:
            future = batcher.submit(table)
        except Overloaded as exc:
            self.metrics.rejected.inc()
            raise ApiError(503, f"server busy: {exc}; retry shortly", "overloaded", {"Retry-After": "1"}) from None
        self.metrics.queue_rows.set(batcher.queued_rows)
        try:
            return await asyncio.wrap_future(future)
        except RowsRejected as exc:  # the request's own fault (its prompt is over the context...)
            pos, error = min(exc.errors.items())
            where = f"{rows}[{pos}]: " if table.num_rows > 1 or rows != "rows" else ""
            raise ApiError(400, f"{where}{error}", "invalid_request") from None
        except BulkinferError as exc:
            refused = withheld(str(exc), type(exc).__name__, self.cfg.execution.redact)
            raise ApiError(422, f"the model refused this request: {refused}", "model_error") from None
        except Exception as exc:
            message = withheld(" ".join(str(exc).split())[:300], type(exc).__name__, self.cfg.execution.redact)
            raise ApiError(
                422, f"the model failed on this request: {type(exc).__name__}: {message}", "model_error"
            ) from None

    def feature_values(self, table: pa.Table) -> list[dict[str, Any]]:
        """Each row's Feast features as the model's reader finds them (read again for the answer)."""
        if not isinstance(self.adapter, FeastFed):
            raise ApiError(400, "features=true: this model reads no Feast features", "invalid_request")
        rows: list[dict[str, Any]] = self.adapter.reader(table).to_pylist()
        return rows

    def answer_rows(self, table: pa.Table, outputs: dict[str, pa.Array]) -> list[dict[str, Any]]:
        """Kept input columns and the model's, as an offline run writes them."""
        kept = [c for c in self.passthrough if c in table.column_names]
        columns = [*(table.column(c) for c in kept), *outputs.values()]
        rows: list[dict[str, Any]] = pa.Table.from_arrays(columns, names=[*kept, *outputs]).to_pylist()
        return rows


def _lock_state(root: Path) -> Any:
    """The batch service's folder is one server's: a second server on it would run the same
    batches twice. The lock dies with the process (a killed server leaves it free)."""
    fh, holder = try_lock(root / "server.lock")
    if fh is None:
        raise ConfigError(
            f"serve.batches: {root} is in use by another server ({holder or 'another process'}); "
            "stop it, or give this one another folder"
        )
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    return fh


def _results(where: str, cfg: JobConfig) -> ResultIndex | RedisResults:
    """A finished run's folder, or the current snapshot of a job's Redis export."""
    if where.startswith(("redis://", "rediss://", "unix://")):
        from .redis_results import RedisResults

        return RedisResults(where, cfg)
    return ResultIndex(where, cfg.source.id_column)
