"""The batch service's queue (``/v1/batches``): OpenAI's lifecycle over bulkinfer jobs.

::

    validating ─► in_progress ─► finalizing ─► completed
        │              │  └─► cancelling ─► cancelled      (the answered part kept)
        └─► failed     └─► expired                          (the rest: batch_expired error lines)

Each batch is a record in ``<serve.batches>/batches/<id>.json`` (the OpenAI Batch object and
who owns it), written at every change, and its job's output in ``batches/<id>/``. A batch is
checked as a whole in a thread of its own (``validating``), then waits its turn: at most
``serve.batch_concurrency`` run at once, in order of creation. A server stopped (SIGTERM) or
killed mid-batch finds its batches ``in_progress`` on the next start and resumes their jobs:
every ``custom_id`` answered once. A sweeper expires batches past ``expires_at`` and removes
files past theirs.

A batch's end is written so that a kill at any point loses nothing and doubles nothing: the
intent (its final status and the ids its output and error files will have) is saved first;
the files are adopted under those ids (again, after a restart: the same files); then the
status, the file ids and the events to send (its *outbox*) are saved in one write; then the
events go to the audit log and the webhook queue, and leave the outbox. A restart finishes an
intent and sends what an outbox holds; a webhook event's id comes from the batch and the event,
so a receiver drops one sent twice.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters import Adapter
from ..config import JobConfig
from ..core.errors import BulkinferError, Interrupted
from ..core.faults import crash_point
from ..core.threads import thread
from .audit import AuditLog
from .batch_jobs import job_config, run_batch, stopped_files, validate
from .files import FileStore, StoredFile, link_or_copy, new_file_id, write_json
from .validation import ApiError
from .webhooks import Webhooks

__all__ = ["ACTIVE", "TERMINAL", "BatchQueue"]

log = logging.getLogger("bulkinfer")

TERMINAL = ("completed", "failed", "expired", "cancelled")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
WINDOWS = {"24h": 24 * 3600.0}


@dataclass
class _Batch:
    record: dict[str, Any]  # the Batch object, and private fields starting with "_"
    stop: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # why ``stop`` was set: cancel, expire, shutdown
    running: bool = False
    since: float = 0.0  # when this run started (rows/s)
    rows_at_start: int = 0

    @property
    def id(self) -> str:
        return str(self.record["id"])

    @property
    def status(self) -> str:
        return str(self.record["status"])

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in self.record.items() if not k.startswith("_")}


class BatchQueue:
    """Batches by id, their threads, and the events they send."""

    def __init__(
        self,
        cfg: JobConfig,
        root: Path,
        files: FileStore,
        model: Callable[[], Adapter | None],
        *,
        audit: AuditLog,
        webhooks: Webhooks,
    ) -> None:
        self.cfg, self.sv, self.files, self.model = cfg, cfg.serve, files, model
        self.audit, self.webhooks = audit, webhooks
        self.dir = root / "batches"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._batches: dict[str, _Batch] = {}
        for path in sorted(self.dir.glob("batch_*.json")):
            record = json.loads(path.read_text())
            self._batches[record["id"]] = _Batch(record)
        self.answered = self.failed = 0  # requests this process ran (metrics)

    # -- the process ---------------------------------------------------------
    def start(self) -> None:
        """Resume what a stopped server left: events unsent, checks, runs, cancellations; then the workers."""
        for b in self._ordered():
            self._flush(b)
            if b.status == "validating":
                self._spawn(self._validate, b)
            elif b.status == "cancelling":
                self._spawn(self._end, b, "cancelled")
        resumed = [b.id for b in self._ordered() if b.status in ("in_progress", "finalizing")]
        if resumed:
            log.info("resuming %d batch(es) left in progress: %s", len(resumed), ", ".join(resumed))
        for i in range(self.sv.batch_concurrency):
            self._spawn(self._work, name=f"bulkinfer-batch-{i}")
        self._spawn(self._sweep, name="bulkinfer-batch-sweeper")

    def close(self, timeout: float = 60.0) -> None:
        """Stop taking work; running batches commit what is in flight and stay in progress."""
        with self._lock:
            self._closing = True
            for b in self._batches.values():
                if b.running:
                    b.reason = b.reason or "shutdown"
                    b.stop.set()
            self._lock.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _spawn(self, target: Callable[..., None], *args: Any, name: str = "bulkinfer-batch") -> None:
        t = thread(target, *args, name=name)
        self._threads.append(t)
        t.start()

    # -- the routes' side ----------------------------------------------------------
    def create(self, owner: str | None, source: StoredFile, endpoint: str, window: str, metadata: Any,
               output_expires_s: int | None) -> dict[str, Any]:  # fmt: skip
        """A new batch over ``source`` (a copy kept with the batch: deleting the upload cannot
        break it), ``validating`` until its file is checked."""
        now = time.time()
        bid = "batch_" + secrets.token_hex(12)
        window_s = self.sv.batch_window_s or WINDOWS[window]
        folder = self.dir / bid
        folder.mkdir()
        link_or_copy(self.files.path(source), folder / "input.jsonl")
        record: dict[str, Any] = {
            "id": bid, "object": "batch", "endpoint": endpoint, "model": self.cfg.model.served_name or
            self.cfg.model.name, "errors": None, "input_file_id": source.id, "completion_window": window,
            "status": "validating", "output_file_id": None, "error_file_id": None, "created_at": int(now),
            "in_progress_at": None, "expires_at": int(now + window_s), "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata, "usage": None,
            "_owner": owner, "_deadline": now + window_s, "_order": time.time_ns(),
            "_output_expires_s": output_expires_s,
        }  # fmt: skip
        b = _Batch(record)
        with self._lock:
            self._batches[bid] = b
            self._save(b)
        self.audit.event(owner, "batch.created", bid, input_file_id=source.id, endpoint=endpoint)
        created = b.public()  # as created: the check below may move it on before this is answered
        self._spawn(self._validate, b)
        return created

    def get(self, bid: str, owner: str | None) -> dict[str, Any]:
        return self._owned(bid, owner).public()

    def owned_by(self, owner: str | None) -> list[dict[str, Any]]:
        """The owner's batches, newest first."""
        return [b.public() for b in reversed(self._ordered()) if b.record["_owner"] == owner]

    def cancel(self, bid: str, owner: str | None) -> dict[str, Any]:
        b = self._owned(bid, owner)
        with self._lock:
            if b.status in TERMINAL or b.status == "cancelling":
                raise ApiError(
                    409, f"batch {bid} is {b.status}: only a validating or in-progress batch can be cancelled",
                    "invalid_request", code="batch_not_cancellable",
                )  # fmt: skip
            self._set(b, "cancelling")
            running = b.running
            if running:
                b.reason = "cancel"
                b.stop.set()
        self.audit.event(owner, "batch.cancelling", bid)
        if not running:  # waiting its turn (or being checked): nothing in flight to wait for
            self._spawn(self._end, b, "cancelled")
        return b.public()

    def _owned(self, bid: str, owner: str | None) -> _Batch:
        with self._lock:
            b = self._batches.get(bid)
        if b is None or b.record["_owner"] != owner:
            raise ApiError(404, f"no batch {bid!r}", "invalid_request", param="batch_id", code="not_found")
        return b

    def counts(self) -> dict[str, int]:
        """Batches by status (metrics)."""
        out = dict.fromkeys((*ACTIVE, *TERMINAL), 0)
        with self._lock:
            for b in self._batches.values():
                out[b.status] += 1
        return out

    def rows_per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            running = [b for b in self._batches.values() if b.running and now > b.since]
            return sum((_done(b.record) - b.rows_at_start) / (now - b.since) for b in running)

    # -- state ---------------------------------------------------------------
    def _ordered(self) -> list[_Batch]:
        with self._lock:
            return sorted(self._batches.values(), key=lambda b: b.record["_order"])

    def _save(self, b: _Batch) -> None:
        write_json(self.dir / f"{b.id}.json", b.record)

    def _set(self, b: _Batch, status: str, **fields: Any) -> None:
        """Move ``b`` to ``status`` (stamping ``<status>_at``) and write it, a final status with
        its event in the outbox (:meth:`_flush` sends it); the lock is held."""
        b.record.update(fields, status=status)
        if status in TERMINAL:
            b.record["_outbox"] = [*b.record.get("_outbox", []), f"batch.{status}"]
        stamp = f"{status}_at"
        if stamp in b.record and b.record[stamp] is None:
            b.record[stamp] = int(time.time())
        self._save(b)
        self._lock.notify_all()

    # -- the threads ---------------------------------------------------------
    def _validate(self, b: _Batch) -> None:
        try:
            total, errors = validate(self.dir / b.id / "input.jsonl", b.record["endpoint"], self.sv.max_batch_requests)
        except OSError as exc:
            total, errors = 0, [{"code": "unreadable_file", "message": f"cannot read the input file ({exc})"}]
        crash_point("batch-validating")
        with self._lock:
            if b.status != "validating":  # cancelled meanwhile
                return
            counts = {"total": total, "completed": 0, "failed": 0}
            if errors:
                self._set(b, "failed", errors={"object": "list", "data": errors}, request_counts=counts)
            else:
                self._set(b, "in_progress", request_counts=counts)
        self._flush(b)

    def _next(self) -> _Batch | None:
        """The oldest batch waiting to run (blocks); None when the server is closing."""
        with self._lock:
            while not self._closing:
                if self.model() is not None:
                    for b in sorted(self._batches.values(), key=lambda b: b.record["_order"]):
                        if b.status in ("in_progress", "finalizing") and not b.running:
                            b.running, b.since, b.rows_at_start = True, time.monotonic(), _done(b.record)
                            return b
                self._lock.wait(0.5)
        return None

    def _work(self) -> None:
        while (b := self._next()) is not None:
            try:
                self._run(b)
            except Exception as exc:  # a bug must not stop the queue: the batch fails, saying why
                log.error("batch %s: unexpected %s: %s", b.id, type(exc).__name__, exc)
                self._fail(b, f"internal error: {type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    b.running = False
                    self._lock.notify_all()

    def _run(self, b: _Batch) -> None:
        if "_finishing" in b.record:  # killed while ending: end as decided, run nothing more
            self._complete(b)
            return
        folder = self.dir / b.id
        cfg = job_config(self.cfg, folder / "input.jsonl", folder / "output", self.sv.batch_shard_rows)
        model = self.model()
        assert model is not None
        try:
            out, err = run_batch(cfg, model, b.stop, lambda done, failed: self._progress(b, done, failed))
        except Interrupted:
            if b.reason == "cancel":
                self._end(b, "cancelled")
            elif b.reason == "expire":
                self._end(b, "expired")
            else:
                log.info("batch %s: stopped with the server; it resumes on the next start", b.id)
            return
        except BulkinferError as exc:
            self._fail(b, str(exc))
            return
        self._finish(b, "completed", out, err)

    def _progress(self, b: _Batch, answered: int, failed: int) -> None:
        with self._lock:
            before = _done(b.record)
            counts = {**b.record["request_counts"], "completed": answered, "failed": failed}
            self.answered += max(0, answered - b.record["request_counts"]["completed"])
            self.failed += max(0, failed - b.record["request_counts"]["failed"])
            b.record["request_counts"] = counts
            if answered + failed >= counts["total"] and b.status == "in_progress":
                self._set(b, "finalizing")
            elif answered + failed != before:
                self._save(b)

    def _end(self, b: _Batch, status: str) -> None:
        """A batch stopped before its end: its answered part (and, expired, the rest as errors)."""
        folder = self.dir / b.id
        out, err = stopped_files(folder / "output", folder / "input.jsonl", expired=status == "expired")
        self._finish(b, status, out, err)

    def _finish(self, b: _Batch, status: str, out: Path, err: Path) -> None:
        """The batch's end (see the module): its intent saved (unless a kill left one: the end
        decided then stands), then :meth:`_complete`."""
        with self._lock:
            if "_finishing" not in b.record:
                files = {"output_file_id": (str(out), "output"), "error_file_id": (str(err), "error")}
                b.record["_finishing"] = {
                    "status": status, "files": {k: [new_file_id(), p, kind] for k, (p, kind) in files.items()}
                }  # fmt: skip
                self._save(b)
        crash_point("batch-finalizing")
        self._complete(b)

    def _complete(self, b: _Batch) -> None:
        """An intent carried out: the files adopted under its ids, then the status with its
        event in one write, then the event sent."""
        intent = b.record["_finishing"]
        ids, lines = self._adopt(b, intent["files"])
        crash_point("batch-adopted")
        status = intent["status"]
        with self._lock:
            counts = {
                **b.record["request_counts"],
                "completed": lines["output_file_id"],
                "failed": lines["error_file_id"],
            }
            if status == "completed" and b.record["finalizing_at"] is None:
                b.record["finalizing_at"] = int(time.time())
            del b.record["_finishing"]
            self._set(b, status, request_counts=counts, **ids)
        crash_point("batch-status-saved")
        self._flush(b)

    def _adopt(self, b: _Batch, files: dict[str, list[str]]) -> tuple[dict[str, str | None], dict[str, int]]:
        """The batch's output and error files kept under the ids its intent chose (an empty one: none)."""
        keep = b.record["_output_expires_s"]
        expires = int(time.time() + keep) if keep else None
        ids: dict[str, str | None] = {}
        lines: dict[str, int] = {}
        for name, (fid, path, kind) in files.items():
            lines[name] = _lines(Path(path))
            ids[name] = None
            if lines[name]:
                ids[name] = self.files.adopt(
                    Path(path), fid=fid, filename=f"{b.id}_{kind}.jsonl", purpose="batch_output",
                    owner=b.record["_owner"], expires_at=expires,
                ).id  # fmt: skip
        return ids, lines

    def _fail(self, b: _Batch, message: str) -> None:
        with self._lock:
            self._set(b, "failed", errors={"object": "list", "data": [{"code": "batch_failed", "message": message,
                                                                          "line": None, "param": None}]})  # fmt: skip
        self._flush(b)

    def _flush(self, b: _Batch) -> None:
        """The events in ``b``'s outbox to the audit log and the webhook queue, then out of it."""
        with self._lock:
            events = list(b.record.get("_outbox", []))
        if not events:
            return
        for event in events:
            log.info("batch %s: %s (%s)", b.id, b.status, _counts_line(b.record))
            self.audit.event(b.record["_owner"], event, b.id, **b.record["request_counts"])
            self.webhooks.emit(event, b.id)
        with self._lock:
            b.record["_outbox"] = [e for e in b.record["_outbox"] if e not in events]
            self._save(b)

    def _sweep(self) -> None:
        """Expire batches past their window; remove files past their expiry."""
        tick = min(1.0, max(0.05, (self.sv.batch_window_s or 60.0) / 20))
        while True:
            with self._lock:
                if self._closing:
                    return
                self._lock.wait(tick)
                now = time.time()
                due = [b for b in self._batches.values() if b.status in ACTIVE and now >= b.record["_deadline"]]
                idle = []
                for b in due:
                    if b.status == "cancelling":
                        continue
                    if b.running:
                        if b.reason is None:
                            b.reason = "expire"
                            b.stop.set()
                    else:
                        b.running = True  # no worker takes it now
                        idle.append(b)
            for b in idle:
                try:
                    self._end(b, "expired")
                finally:
                    with self._lock:
                        b.running = False
            self.files.sweep()


def _done(record: dict[str, Any]) -> int:
    c = record["request_counts"]
    return int(c["completed"]) + int(c["failed"])


def _lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def _counts_line(record: dict[str, Any]) -> str:
    c = record["request_counts"]
    return f"{c['completed']} answered, {c['failed']} failed of {c['total']}"
