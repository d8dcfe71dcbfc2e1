"""One batch of the batch service as a bulkinfer job: the checks of its input file, the job
over it (the ``openai-batch`` source and sink, the ledger: every ``custom_id`` answered
exactly once, a crash resumed), on the server's model through the share, and the output and
error files of a batch that stopped before its end (cancelled, expired)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..adapters import Adapter
from ..adapters.moderation_requests import MODERATIONS, ModerationRequests
from ..commit.finish import batch_answers
from ..commit.ledger import Ledger
from ..config import ExecutionConfig, JobConfig, SinkConfig, SourceConfig
from ..job import run_job
from ..llm.batch_files import BATCH_ERRORS, BATCH_OUTPUT
from ..llm.openai_api import CHAT, COMPLETIONS, EMBEDDINGS, request_id
from ..report import RunStats
from .share import ModelShare, SharedModel

__all__ = ["ENDPOINTS", "batch_model", "job_config", "run_batch", "stopped_files", "validate"]

ENDPOINTS = {"text-embedding": (EMBEDDINGS,), "generate": (CHAT, COMPLETIONS), "ensemble": (MODERATIONS,)}
"""The endpoints a batch may name, by the served model's kind."""

EXPIRED = "This request could not be executed before the completion window expired."


def job_config(server_cfg: JobConfig, input_path: Path, out_dir: Path, shard_rows: int) -> JobConfig:
    """The job of one batch: the server's model and runtime (settled already) over its file.
    Any line the upload took is read (a line is at most the file, which is at most
    ``serve.max_file_bytes``): a long request is answered by the model's own limits, with its
    custom_id, never refused for a reader's setting the client cannot change."""
    most = max(server_cfg.serve.max_file_bytes, SourceConfig().max_record_bytes)
    source = SourceConfig(paths=[str(input_path)], format="openai-batch", shard_rows=shard_rows, max_record_bytes=most)
    return JobConfig(
        source=source,
        model=server_cfg.model,
        models=server_cfg.models,
        moderation=server_cfg.moderation,
        runtime=server_cfg.runtime,
        sink=SinkConfig(path=str(out_dir), format="openai-batch"),
        execution=ExecutionConfig(progress="none", redact=server_cfg.execution.redact),
    )


def batch_model(
    kind: str, adapter: Adapter, names: list[str], share: ModelShare, moderation: tuple[Any, Any] | None = None
) -> Adapter:
    """The adapter a batch job runs: the server's (set up once), called through ``share``; an
    embeddings or moderations batch's requests are read by the same request adapter as
    ``bulkinfer run``'s (``moderation``: the job's [moderation] and its categories' input types)."""
    shared = SharedModel(adapter, share)
    if kind == "ensemble":
        assert moderation is not None
        return ModerationRequests(shared, names, *moderation)
    if kind == "text-embedding":
        from ..adapters.embed_requests import EmbeddingRequests

        return EmbeddingRequests(shared, names)
    return shared  # the server's generation adapter reads requests already


def validate(path: Path, endpoint: str, max_requests: int) -> tuple[int, list[dict[str, Any]]]:
    """``(requests, errors)`` of a batch's input file: the errors (OpenAI's ``errors.data``)
    say why the file as a whole cannot run; a line that is merely bad is its own request's
    error line later, not the file's."""
    total = objects = 0
    errors: list[dict[str, Any]] = []
    for row, obj in _lines(path):
        total = row + 1
        if not isinstance(obj, dict):
            continue
        objects += 1
        url = obj.get("url")
        if isinstance(url, str) and url != endpoint and len(errors) < 100:
            errors.append(_error(
                "mismatched_endpoint", f"line {total}: url {url!r}, but this batch's endpoint is {endpoint}; "
                "one endpoint per batch", total, "url",
            ))  # fmt: skip
    if total == 0:
        errors.append(_error("empty_file", "the input file holds no request (it is empty)"))
    elif objects == 0:
        why = "no line is a JSON object: the file must be JSONL, one request per line"
        errors.append(_error("invalid_file_format", why))
    if total > max_requests:
        errors.append(_error(
            "too_many_requests", f"{total} requests, over the limit of {max_requests} per batch "
            "(serve.max_batch_requests); split the file",
        ))  # fmt: skip
    return total, errors


def _error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "line": line, "param": param}


def run_batch(
    cfg: JobConfig, model: Adapter, stop: threading.Event, on_commit: Callable[[int, int], None]
) -> tuple[Path, Path]:
    """Run (or resume) the batch's job to the end; its output and error files. ``on_commit``
    sees the requests answered and failed so far, after each commit. ``Interrupted`` when
    ``stop`` is set: what was committed is kept, and running it again resumes it."""
    out = Path(cfg.sink.path)
    answered, failed = _committed(Ledger(out))

    def counts(stats: RunStats) -> None:
        on_commit(answered + stats.rows_out, failed + stats.rows_failed)

    run_job(cfg, stop=stop, model=model, on_commit=counts)
    return out / BATCH_OUTPUT, out / BATCH_ERRORS


def _committed(ledger: Ledger) -> tuple[int, int]:
    """Requests answered and failed in what an earlier run committed (0, 0 for a fresh batch)."""
    if not ledger.log_path.is_file():
        return 0, 0
    with ledger:
        commits = ledger.commits()
    return sum(c.rows for c in commits), sum(c.errors for c in commits)


def stopped_files(out: Path, input_path: Path, *, expired: bool) -> tuple[Path, Path]:
    """The output and error files of a batch stopped before its end: the committed answers and
    errors and, when it expired, a ``batch_expired`` error line for every request not run."""
    out.mkdir(parents=True, exist_ok=True)
    with Ledger(out) as ledger:
        commits = ledger.commits() if ledger.log_path.is_file() else []
        plan = ledger.read_plan()
        batch_answers(ledger, commits, plan.input_errors if plan else [])
    if expired:
        done = [(c.start, c.stop) for c in commits]
        with open(out / BATCH_ERRORS, "a", encoding="utf-8") as errors:
            for row, obj in _lines(input_path):
                if not any(a <= row < b for a, b in done):
                    cid = obj.get("custom_id") if isinstance(obj, dict) else None
                    line = _expired_line(row, cid if isinstance(cid, str) else None)
                    errors.write(json.dumps(line, ensure_ascii=False) + "\n")
    return out / BATCH_OUTPUT, out / BATCH_ERRORS


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Each non-empty line's row number (as the source numbers them) and its JSON (None when
    the line is not JSON)."""
    with open(path, "rb") as fh:
        row = 0
        for raw in fh:
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            yield row, obj
            row += 1


def _expired_line(row: int, cid: str | None) -> dict[str, Any]:
    rid = request_id("batch_req", f"{cid}\0expired:{row}")
    return {"id": rid, "custom_id": cid, "response": None, "error": {"code": "batch_expired", "message": EXPIRED}}
