"""The remote runner: a job's shards through an OpenAI-compatible Batch API, exactly once, and
never paying twice.

Shards are grouped into request files within ``model.batch_max_requests`` and
``model.batch_max_bytes``. Each group's *intent* is written to the output's ledger before
anything is sent: its shards and a tag unique to this output and group. The upload's file id
and the batch's id are written as soon as they exist; the tag also goes into the batch's
``metadata``. A client killed at any step therefore finds its batches again on the rerun:

- by the recorded batch id;
- or, killed between the create and its record, by listing the API's batches for the tag.

It polls them instead of creating them anew. A group's results are committed shard by shard
like any shard. A request that failed, expired or was cancelled remotely becomes an error
record, so ``--retry-errors`` resubmits only those. ``stop`` (SIGTERM) ends the polling
without cancelling anything, unless ``model.cancel_on_stop`` asks for it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..adapters import to_arrow_column
from ..adapters.remote_batch import RemoteRequests
from ..config import JobConfig
from ..core.errors import ConfigError, ModelError
from ..core.faults import crash_point
from ..core.records import ErrorRecord
from ..core.schema import parse_type
from ..precision.gate import GateVerdict
from ..report import RunStats
from ..sources import ROW, Shard, read_shard
from ..sources.shard import ShardOutput
from .contract import Committing, Gate, Pass
from .window import row_id

__all__ = ["RemoteBatchRunner"]

log = logging.getLogger("bulkinfer")

INTENTS = "remote_batches.json"
TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class _Group:
    key: str
    shards: list[Shard]
    record: dict[str, Any]  # what the ledger holds of it: tag, shards, file_id, batch_id


def _custom_id(shard: int, row: int) -> str:
    return f"s{shard}-r{row}"


class RemoteBatchRunner:
    """Runs shards through the Batch API at ``model.base_url``."""

    def __init__(self, cfg: JobConfig, adapter: RemoteRequests, stats: RunStats, stop: threading.Event,
                 ledger: Any) -> None:  # fmt: skip
        if cfg.execution.backend != "local":
            raise ConfigError("execution.backend: a remote-batch model runs from one client; use the local backend")
        if cfg.sink.input_hash or cfg.source.previous:
            raise ConfigError("source.previous / sink.input_hash: incremental runs are not done for remote-batch yet")
        self.cfg, self.adapter, self.stats, self.stop, self.ledger = cfg, adapter, stats, stop, ledger
        self.m = cfg.model
        self.on_progress: Callable[[], None] = lambda: None
        self.passthrough = cfg.passthrough_columns
        self.columns = list(dict.fromkeys([*adapter.input_columns, *self.passthrough]))
        self.types = {c: parse_type(t) for c, t in cfg.source.column_types.items()}
        self.client: Any = None
        self.work: dict[int, tuple[Committing, frozenset[int] | None]] = {}  # shard -> its committer, its rows

    def start(self, gate: Gate) -> GateVerdict:
        from openai import OpenAI

        key = os.environ.get(self.m.api_key_env)
        if not key:
            raise ConfigError(f"model.api_key_env: set {self.m.api_key_env} to the Batch API's key")
        self.client = OpenAI(base_url=self.m.base_url, api_key=key, max_retries=6, timeout=120)
        verdict = gate()
        self.stats.mark_running()
        return verdict

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    # -- the ledger's record of what was sent ------------------------------------------
    def _intents(self) -> dict[str, Any]:
        state = self.ledger.read_private(INTENTS)
        if state is None:
            state = {"run": secrets.token_hex(6), "groups": {}}
            self.ledger.write_private(INTENTS, state)
        return dict(state)

    def _save(self, state: dict[str, Any]) -> None:
        self.ledger.write_private(INTENTS, state)

    # -- the runner contract ------------------------------------------------------------
    def run(self, shards: Sequence[Shard], commit: Committing, rows: frozenset[int] | None = None) -> None:
        self.run_passes([(shards, commit, rows)])

    def run_passes(self, passes: Sequence[Pass]) -> None:
        """Every pass at once (``--retry-errors``: one per error file): their rows share batches
        within the limits, and every batch is in flight together, so N error files cost one
        completion window, not N."""
        import openai

        self.work = {s.index: (commit, rows) for shards, commit, rows in passes for s in shards}
        try:
            self._run([s for shards, _c, _r in passes for s in shards])
        except openai.AuthenticationError as exc:
            raise ConfigError(
                f"model.api_key_env: the Batch API at {self.m.base_url} refused the key in {self.m.api_key_env} "
                f"({exc.status_code}); committed rows are kept"
            ) from exc
        except openai.NotFoundError as exc:
            if exc.request.method != "POST":  # a batch or file gone (expired): what a rerun can collect again
                raise ModelError(
                    f"the Batch API at {self.m.base_url}: {exc}; committed rows are kept, rerun to resume"
                ) from exc
            raise ConfigError(  # an API without the route that creates files or batches: the URL must change
                f"model.base_url: {self.m.base_url} has no {exc.request.method} {exc.request.url.path} (404); give "
                "the API's root, which for OpenAI-compatible servers ends in /v1; committed rows are kept"
            ) from exc
        except openai.BadRequestError as exc:  # the server does not take these requests as sent
            raise ConfigError(
                f"model.endpoint: the Batch API at {self.m.base_url} refused {exc.request.method} "
                f"{exc.request.url.path} for {self.m.endpoint} (400: {_said(exc)}); check model.endpoint and "
                "model.name; committed rows are kept"
            ) from exc
        except openai.APIError as exc:  # what retries could not fix: one line, committed rows kept, rerun resumes
            raise ModelError(
                f"the Batch API at {self.m.base_url}: {type(exc).__name__}: {exc}; committed rows are kept, "
                "rerun to resume"
            ) from exc

    def _run(self, shards: Sequence[Shard]) -> None:
        state = self._intents()
        groups = self._groups(shards, state)
        pending: list[_Group] = []
        for g in groups:
            if self.stop.is_set():
                break
            self._submit(g, state)
            pending.append(g)
        seen: dict[str, str] = {}  # batch id -> status, for the progress display
        while pending and not self.stop.is_set():
            for g in list(pending):
                batch = self._answered(self.client.batches.retrieve(g.record["batch_id"]), "GET /batches/{id}")
                seen[batch.id] = batch.status
                self.stats.remote_batches = dict(Counter(seen.values()))
                self.on_progress()
                if batch.status in TERMINAL:
                    self._collect(g, batch)
                    pending.remove(g)
                    del state["groups"][g.key]
                    self._save(state)
                    self._delete_upload(g)
            if pending:
                crash_point("remote-polled")
                self.stop.wait(self.m.poll_s)
        if pending and self.m.cancel_on_stop:
            for g in pending:
                self.client.batches.cancel(g.record["batch_id"])
                log.info("cancelled remote batch %s (model.cancel_on_stop)", g.record["batch_id"])

    def _rows(self, shard: Shard) -> frozenset[int] | None:
        """The rows of ``shard`` to run (None: all of them; ``--retry-errors``: its failed ones)."""
        return self.work[shard.index][1]

    def _groups(self, shards: Sequence[Shard], state: dict[str, Any]) -> list[_Group]:
        """The groups recorded by an earlier run (their remaining shards), then new ones, each
        at most ``model.batch_max_requests`` requests."""
        by_index = {s.index: s for s in shards}
        groups, covered = [], set()
        for key, record in state["groups"].items():
            covered.update(record["shards"])
            mine = [by_index[i] for i in record["shards"] if i in by_index]
            if mine:
                groups.append(_Group(key, mine, record))
        fresh: list[Shard] = []
        count = 0
        for s in (s for s in shards if s.index not in covered):
            rows = self._rows(s)
            n = len(rows) if rows is not None else s.num_rows
            if fresh and count + n > self.m.batch_max_requests:
                groups.append(self._new(fresh, state))
                fresh, count = [], 0
            fresh.append(s)
            count += n
        if fresh:
            groups.append(self._new(fresh, state))
        return groups

    def _new(self, shards: list[Shard], state: dict[str, Any]) -> _Group:
        first = shards[0].index
        key = f"g{first}" if self._rows(shards[0]) is None else f"retry{first}-{secrets.token_hex(3)}"
        record = {"tag": f"bulkinfer-{state['run']}-{key}", "shards": [s.index for s in shards],
                  "file_id": None, "batch_id": None}  # fmt: skip
        return _Group(key, shards, record)

    # -- send -----------------------------------------------------------------------------
    def _requests(self, g: _Group) -> bytes:
        """The group's request file (a row that makes no request is left out: it becomes an
        error record when the group's results are collected)."""
        lines = []
        for shard, table in self._read(g.shards, []):
            numbers = table.column(ROW).to_pylist()
            for pos, row in enumerate(table.select(self.adapter.input_columns).to_pylist()):
                try:
                    body = self.adapter.body(row)
                except (ValueError, KeyError):
                    continue
                cid = _custom_id(shard.index, numbers[pos])
                lines.append(json.dumps({"custom_id": cid, "method": "POST", "url": self.m.endpoint, "body": body}))
        data = "".join(line + "\n" for line in lines).encode()
        if len(data) > self.m.batch_max_bytes:
            raise ConfigError(
                f"model.batch_max_bytes: the requests of shards {g.record['shards']} make {len(data)} bytes, over "
                f"{self.m.batch_max_bytes}; lower source.shard_rows or model.batch_max_requests"
            )
        return data

    def _submit(self, g: _Group, state: dict[str, Any]) -> None:
        """Make sure the group's batch exists: found again, or created (its intent recorded first)."""
        r = g.record
        if r["batch_id"] is None and g.key in state["groups"]:  # killed before the id was recorded
            r["batch_id"] = self._find(r["tag"])
        if r["batch_id"] is not None:
            self._save(state)
            return
        state["groups"][g.key] = r  # the intent: written before anything is sent
        self._save(state)
        crash_point("remote-intent")
        if r["file_id"] is None:
            data = self._requests(g)
            upload = self.client.files.create(file=(f"{r['tag']}.jsonl", data), purpose="batch")
            r["file_id"] = self._answered(upload, "the upload (POST /files)").id
            self._save(state)
            crash_point("remote-uploaded")
        r["batch_id"] = self._create(r)
        self._save(state)
        log.info("remote batch %s created for shards %s", r["batch_id"], r["shards"])

    def _create(self, r: dict[str, Any], attempts: int = 6) -> str:
        """Create the group's batch. A create that may have reached the API (a 5xx, a cut
        connection, a timeout) is never simply sent again: the API's batches are searched for
        the tag first, so a retry cannot make (and bill) a second batch."""
        import openai

        once = self.client.with_options(max_retries=0)
        for attempt in range(attempts):
            try:
                batch = once.batches.create(
                    input_file_id=r["file_id"], endpoint=self.m.endpoint, completion_window=self.m.completion_window,
                    metadata={"bulkinfer_tag": r["tag"]},
                )  # fmt: skip
                crash_point("remote-created")
                return str(self._answered(batch, "the batch's creation (POST /batches)").id)
            except openai.RateLimitError as exc:  # refused before anything was made
                why: Exception = exc
            except (openai.APIConnectionError, openai.InternalServerError) as exc:
                found = self._find(r["tag"])
                if found is not None:
                    return found
                why = exc
            log.info("creating the batch for %s failed (%s); trying again", r["tag"], why)
            self.stop.wait(min(30.0, 0.5 * 2**attempt))
        raise ModelError(f"the Batch API at {self.m.base_url} did not create a batch in {attempts} tries: {why}")

    def _answered(self, answer: Any, what: str) -> Any:
        """``answer`` when it is the object the API was asked for; a 200 of something else (an
        HTML page from a proxy or a login wall, which the client hands back as text) is one
        line naming the URL: no rerun can fix it."""
        if hasattr(answer, "id"):
            return answer
        shown = " ".join(str(answer).split())[:80]
        raise ConfigError(
            f"model.base_url: {self.m.base_url} answered {what} with something that is not the Batch API's "
            f"JSON ({shown!r}...): a proxy or a login page? check model.base_url; committed rows are kept"
        )

    def _find(self, tag: str) -> str | None:
        """The batch created for ``tag`` by a run that died before recording its id."""
        for batch in self.client.batches.list(limit=100):
            batch = self._answered(batch, "GET /batches")
            if (batch.metadata or {}).get("bulkinfer_tag") == tag:
                log.info("found remote batch %s again (created before a crash)", batch.id)
                return str(batch.id)
        return None

    # -- collect --------------------------------------------------------------------------
    def _delete_upload(self, g: _Group) -> None:
        """The group's request file, deleted from the provider once its results are committed
        (it holds the job's inputs; a failed delete is logged, the file expires there)."""
        import openai

        try:
            self.client.files.delete(g.record["file_id"])
        except openai.APIError as exc:
            log.warning("remote batch file %s not deleted (%s); delete it by hand", g.record["file_id"], exc)

    def _collect(self, g: _Group, batch: Any) -> None:
        answers, failures = self._results(batch)
        why = _status_error(batch)
        prompt = completion = 0
        for one in g.shards:
            commit = self.work[one.index][0]
            errors: list[ErrorRecord] = []
            read = list(self._read([one], errors))
            if not read:
                commit(ShardOutput(one, pa.table({}), errors))
                continue
            shard, table = read[0]
            numbers = table.column(ROW).to_pylist()
            inputs = table.select(self.adapter.input_columns).to_pylist()
            keep, bodies = [], []
            for pos, row in enumerate(numbers):
                cid = _custom_id(shard.index, row)
                if cid in answers:
                    keep.append(pos)
                    bodies.append(answers[cid])
                    continue
                rid = row_id(table, pos, self.cfg.source.id_column)
                try:
                    self.adapter.body(inputs[pos])
                except (ValueError, KeyError) as exc:  # it made no request
                    errors.append(ErrorRecord.of(shard.uri, row, "preprocess", exc, row_id=rid))
                    continue
                message = failures.get(cid) or why or "missing from the batch's output and error files"
                errors.append(ErrorRecord.of(shard.uri, row, "predict", ModelError(message), row_id=rid))
            table_out = pa.table({})
            columns = self.adapter.columns(bodies) if bodies else {}
            if keep:
                out = table.take(pa.array(keep, pa.int64()))
                arrays = [out.column(c) for c in self.passthrough]
                arrays += [to_arrow_column(values, name) for name, values in columns.items()]
                table_out = pa.Table.from_arrays(arrays, names=[*self.passthrough, *columns])
            usage = [b.get("usage") or {} for b in bodies]  # what the provider bills
            prompt += sum(int(u.get("prompt_tokens") or 0) for u in usage)
            completion += sum(int(u.get("completion_tokens") or 0) for u in usage)
            self.stats.rows_inferred += len(numbers)
            crash_point("remote-downloaded")
            commit(ShardOutput(shard, table_out, sorted(errors, key=lambda e: (e.row is None, e.row or 0))))
            self.on_progress()
        if prompt or completion:
            self.stats.add_generated(prompt, completion)
        log.info("remote batch %s: %s (%d answered, %d failed)", batch.id, batch.status, len(answers), len(failures))

    def _results(self, batch: Any) -> tuple[dict[str, Any], dict[str, str]]:
        """``custom_id`` -> response body of the answers, and -> message of the failures."""
        answers: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for line in self._download(batch.output_file_id) + self._download(batch.error_file_id):
            cid = line.get("custom_id")
            if not isinstance(cid, str):  # a line of the file itself, not one of our requests
                continue
            response = line.get("response") or {}
            body = response.get("body")
            error = line.get("error")
            if error is None and response.get("status_code") == 200:
                bad = self.adapter.check_answer(self.m.endpoint, body)
                if bad is None:
                    answers[cid] = body
                    continue
                failures[cid] = bad
                continue
            detail = (error or (body or {}).get("error") or {}) if isinstance(error or body, dict) else {}
            code = response.get("status_code")
            failures[cid] = f"{detail.get('code') or code}: {detail.get('message') or 'the request failed'}"
        return answers, failures

    def _download(self, file_id: str | None, attempts: int = 4) -> list[dict[str, Any]]:
        """A result file's lines; a download cut short (a torn last line) is fetched again."""
        if not file_id:
            return []
        for attempt in range(attempts):
            data = self.client.files.content(file_id).read()
            try:
                return [json.loads(x) for x in data.splitlines() if x.strip()]
            except ValueError:
                log.warning("result file %s arrived cut short (attempt %d); fetching it again", file_id, attempt + 1)
                time.sleep(min(8, 2**attempt))
        raise ModelError(f"result file {file_id}: every download arrived cut short; rerun to collect it again")

    def _read(self, shards: list[Shard], errors: list[ErrorRecord]) -> Iterator[tuple[Shard, pa.Table]]:
        """Each shard's rows (only its rows to run, :meth:`_rows`), with their numbers; unreadable
        rows become ``errors``."""
        src = self.cfg.source
        for shard in shards:

            def bad(row: int, message: str, shard: Shard = shard) -> None:
                errors.append(ErrorRecord.of(shard.uri, row, "read", message))

            batches = list(read_shard(shard, self.columns, src.read_batch_rows, bad, self.types, src.max_record_bytes))
            table = pa.Table.from_batches(batches) if batches else None
            rows = self._rows(shard)
            if table is None:
                continue
            if rows is not None:
                keep = [i for i, r in enumerate(table.column(ROW).to_pylist()) if r in rows]
                table = table.take(pa.array(keep, pa.int64()))
            yield shard, table


def _said(exc: Any) -> str:
    """The message an API error's body gives (OpenAI's ``error.message``), else its text."""
    body = exc.body if isinstance(getattr(exc, "body", None), dict) else {}
    message = body.get("message") or (body.get("error") or {}).get("message") if body else None
    return " ".join(str(message or exc).split())[:200]


def _status_error(batch: Any) -> str | None:
    """What a request that has no line says when its batch ended early."""
    if batch.status == "completed":
        return None
    if batch.status == "failed":
        errors = getattr(getattr(batch, "errors", None), "data", None) or []
        detail = "; ".join(f"{e.code}: {e.message}" for e in errors[:3]) or "no reason given"
        return f"the remote batch {batch.id} failed validation ({detail})"
    return f"batch_{batch.status}: the remote batch {batch.id} ended {batch.status} before this request ran"
