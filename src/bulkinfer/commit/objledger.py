"""The ledger of an object-store output: the same contract as :mod:`.ledger` without rename,
append or flock, using only what the store guarantees.

::

    PREFIX/_bulkinfer/job.json                   the plan
    PREFIX/_bulkinfer/lock                       the live run's lease (holder, heartbeat)
    PREFIX/_bulkinfer/commits/00003-0000000000.json   one object per committed row range
    PREFIX/_bulkinfer/segments/<time>-<run>.jsonl       the records of up to SEGMENT_RECORDS
                                                     commits of one run, one a line

- A commit record is created with ``If-None-Match: *`` (S3 conditional writes): the first
  writer of a row range wins, without a lock server. A shard is committed when its record
  exists; a resume lists the records, so it needs nothing but the store's content (another
  machine can resume).
- The lock is an object created with ``If-None-Match`` and renewed every few seconds with
  ``If-Match`` on its ETag. A second live run is refused; a lease not renewed for
  ``LEASE_S`` seconds (its run died), or held by a process of this host that is gone, is
  taken over, again with ``If-Match``, so two runs taking over at once cannot both win. A
  run that finds its lease taken stops before its next commit.
- Every :data:`SEGMENT_RECORDS` commits, a run also writes the records it made since its
  last segment into one segment object. A resume lists the records (a LIST per 1,000) but
  GETs only those no segment holds, and the segments: at 500,000 shards about 500 GETs
  rather than 500,000. The records stay (their conditional create is what makes a range's
  first writer the only one); a segment only spares reading them one by one.
- Stores without conditional writes (checked by scheme) fall back to check-then-write,
  which cannot tell apart two runs started in the same instant; the log says so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ..core.errors import LedgerError, LockedError, OutputError
from ..core.layout import ERRORS, PRIVATE, SUCCESS
from ..core.records import ErrorRecord, encode_records
from ..core.threads import thread
from ..plan import JobPlan
from ..sinks import Part
from ..sinks.objects import TEMPORARY, ObjectStore, staged_key
from .ledger import Commit, CommitTally, JobStart, restate, success_chunks

__all__ = ["LEASE_S", "SEGMENT_RECORDS", "ObjectLedger"]

log = logging.getLogger("bulkinfer")

LEASE_S = 30.0
"""A lock not renewed for this long belongs to a dead run."""
_RENEW_S = 5.0
SEGMENT_RECORDS = 1000
"""Commit records per segment (a resume GETs one segment instead of this many records)."""
_SEGMENTS = f"{PRIVATE}/segments"
_HELD_HERE: set[str] = set()
"""The leases this process holds now (a lock naming this pid but none of these is a leftover)."""


def _is_ours(key: str) -> bool:
    return key.startswith(("part-", f"{ERRORS}/", f"{PRIVATE}/", f"{TEMPORARY}/")) or key == SUCCESS


class ObjectLedger(JobStart):
    """Lock (a lease), job identity and commit records of one object-store prefix."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.out_dir = store.uri
        self.private = f"{store.uri}/{PRIVATE}"
        self.errors_dir = f"{store.uri}/{ERRORS}"
        self.took_over_from: str | None = None
        self.holds_records = True
        self._etag: str | None = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.run_id = uuid.uuid4().hex
        self._unsegmented: list[str] = []  # this run's records not in a segment yet, as their lines
        if not store.conditional:
            log.warning(
                "%s: this store has no conditional writes; two runs started at the same instant are not told apart",
                store.uri,
            )

    # -- lock (a lease) ---------------------------------------------------------------
    def __enter__(self) -> ObjectLedger:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._write_segment()
        except OutputError as exc_:  # a resume then GETs those records one by one
            log.warning("%s: could not write a commit segment (%s)", self.out_dir, exc_)
        self.release()

    def _holder(self) -> bytes:
        now = time.time()
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "run": self.run_id, "since": now, "renewed": now}
        return json.dumps(holder).encode()

    def acquire(self) -> None:
        key = f"{PRIVATE}/lock"
        self._etag = self.store.put_new(key, self._holder())
        if self._etag is None:
            etag = self.store.etag(key)
            current = self.store.get(key) or b"{}"
            try:
                held = json.loads(current)
            except ValueError:
                held = {}
            age = time.time() - float(held.get("renewed", 0))
            if age < LEASE_S and not _dead_here(held):
                who = f"pid {held.get('pid')} on {held.get('host')}, renewed {age:.0f} s ago"
                raise LockedError(
                    f"{self.out_dir}: another run is writing here ({who}); wait for it, or use another --output"
                )
            self._etag = None if etag is None else self.store.put_if(key, self._holder(), etag)
            if self._etag is None:
                raise LockedError(f"{self.out_dir}: another run took over the lock at the same moment; wait for it")
            self.took_over_from = current.decode(errors="replace")
        _HELD_HERE.add(self.run_id)
        self._stop.clear()
        self._renewer = thread(self._renew_loop, name="bulkinfer-lease")
        self._renewer.start()

    def _renew_loop(self) -> None:
        key = f"{PRIVATE}/lock"
        while not self._stop.wait(_RENEW_S):
            try:
                renewed = None if self._etag is None else self.store.put_if(key, self._holder(), self._etag)
                if renewed is None:
                    log.error("%s: the lock was taken by another run; stopping before the next commit", self.out_dir)
                    self._lost.set()
                    return
                self._etag = renewed
            except OutputError as exc:  # the store is unreachable for now: the commit that follows will say so
                log.warning("%s: could not renew the lock (%s)", self.out_dir, exc)

    def live_holder(self) -> str | None:
        data = self.store.get(f"{PRIVATE}/lock")
        if data is None:
            return None
        try:
            held = json.loads(data)
        except ValueError:
            return "unknown"
        fresh = time.time() - float(held.get("renewed", 0)) < LEASE_S
        return data.decode() if fresh and not _dead_here(held) else None

    def release(self) -> None:
        _HELD_HERE.discard(self.run_id)
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
            if not self._lost.is_set():
                try:
                    self.store.delete([f"{PRIVATE}/lock"])
                except OutputError as exc:  # never hides the error that ended the run; the lease runs out
                    log.warning("%s: could not release the lock (%s); it expires in %.0f s", self.out_dir, exc, LEASE_S)

    # -- plan ---------------------------------------------------------------------------
    def read_plan(self) -> JobPlan | None:
        data = self.store.get(f"{PRIVATE}/job.json")
        if data is None:
            return None
        try:
            return JobPlan.from_lines(data.decode("utf-8").splitlines(keepends=True))
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"{self.private}/job.json: unreadable ({exc}); rerun with --overwrite") from exc

    fresh_output = "choose an empty or new prefix"

    def foreign(self) -> list[str]:
        return [k for k in self.store.ls() if not _is_ours(k)]

    def start_job(self, plan: JobPlan) -> None:
        self.store.put(f"{PRIVATE}/job.json", "".join(plan.json_chunks()).encode())

    def wipe(self) -> None:
        keys = [k for k in self.store.find("") if _is_ours(k) and k != f"{PRIVATE}/lock"]
        self.store.delete(keys)

    # -- commits ------------------------------------------------------------------------
    def _commit_key(self, c: Commit) -> str:
        extra = f"-{c.replaces}" if c.replaces else ""
        return f"{PRIVATE}/commits/{c.shard:05d}-{c.start:010d}{extra}.json"

    def iter_commits(self, repair: bool = True) -> Iterator[Commit]:
        """The commit records (fetched together, then handed out one at a time)."""
        yield from self.commits(repair)

    def commits(self, repair: bool = True) -> list[Commit]:
        """Every commit record: those the segments hold, and the others GET one by one. The
        listing of the records is the truth (a segment names only records that were made)."""
        keys = [k for k in self.store.find(f"{PRIVATE}/commits") if k.endswith(".json")]
        known = self._segmented()
        missing = [k for k in keys if k not in known]
        got = self.store.get_many(missing)
        out = []
        for key in keys:
            if key in known:
                out.append(known[key])
                continue
            try:
                out.append(Commit(**json.loads(got[key])))
            except (KeyError, ValueError, TypeError) as exc:
                raise LedgerError(
                    f"{self.store.url(key)}: unreadable commit record ({exc}); rerun with --overwrite"
                ) from exc
        return sorted(out, key=lambda c: (c.shard, c.start, c.replaces or ""))

    def _segmented(self) -> dict[str, Commit]:
        """The records the segments hold, by key (a segment that does not parse is skipped:
        its records are read one by one)."""
        segments = [k for k in self.store.find(_SEGMENTS) if k.endswith(".jsonl")]
        known: dict[str, Commit] = {}
        for key, data in self.store.get_many(segments).items():
            try:
                lines = [json.loads(line) for line in data.decode().splitlines() if line]
                known.update([(d.pop("key"), Commit(**d)) for d in lines])  # the whole segment, or none of it
            except (KeyError, ValueError, TypeError) as exc:
                log.warning("%s: an unreadable commit segment is skipped (%s)", self.store.url(key), exc)
        return known

    def _write_segment(self) -> None:
        if not self._unsegmented:
            return
        key = f"{_SEGMENTS}/{time.time_ns():020d}-{self.run_id[:12]}.jsonl"
        self.store.put(key, "".join(self._unsegmented).encode())
        self._unsegmented = []

    def commit(self, record: Commit) -> Commit:
        if self._lost.is_set():
            raise OutputError(f"{self.out_dir}: another run took the lock; this one stops (committed shards are kept)")
        key = self._commit_key(record)
        body = json.dumps(asdict(record), sort_keys=True)
        if self.store.put_new(key, body.encode()) is None:
            raise LedgerError(
                f"{self.store.url(key)}: rows {record.start}..{record.stop} of shard "
                f"{record.shard} were committed "
                "by another run; refusing to write them twice"
            )
        self._unsegmented.append(json.dumps({"key": key, **asdict(record)}, sort_keys=True) + "\n")
        if len(self._unsegmented) >= SEGMENT_RECORDS:
            try:
                self._write_segment()
            except OutputError as exc:  # the record is made; a later segment takes these lines too
                log.warning(
                    "%s: could not write a commit segment (%s); a resume reads those records", self.out_dir, exc
                )
        return record

    def commit_many(self, records: Sequence[Commit]) -> None:
        """One commit object each (a store has no append)."""
        for record in records:
            self.commit(record)

    def remove_uncommitted(self, committed: CommitTally, keep: Iterable[str] = ()) -> list[str]:
        assert committed.records is not None, "an object store's ledger folds its commits with their records"
        keep = committed.names | set(keep)
        keep_errors = set(committed.active_error_files())
        present = self.store.ls()
        for c in committed.records:  # a crash between a commit record and its copy: roll it forward
            if c.file and c.file not in present:
                self._roll_forward(c)
        stale = [k for k in present if k.startswith("part-") and k not in keep]
        errors = [k.rsplit("/", 1)[1] for k in self.store.ls(ERRORS)]
        stale += [f"{ERRORS}/{n}" for n in errors if n.startswith("part-") and n not in keep_errors]
        stale += self.store.find(TEMPORARY)
        self.store.delete(stale)
        return stale

    def _roll_forward(self, c: Commit) -> None:
        temp = staged_key(c.file, c.sha256)
        try:
            self.store.copy(temp, c.file)
        except FileNotFoundError:
            raise LedgerError(
                f"{self.store.url(self._commit_key(c))}: commits {c.file}, but neither it nor its staged copy "
                f"{temp} exists (deleted by hand?); rerun with --overwrite"
            ) from None
        log.info("%s: put the committed part in place (its run died before copying it)", self.store.url(c.file))

    # -- files beside the parts -----------------------------------------------------------
    def write_input_errors(self, records: list[ErrorRecord]) -> None:
        self.store.put(f"{ERRORS}/inputs.jsonl", encode_records(records))

    def read_error_file(self, name: str) -> bytes:
        data = self.store.get(f"{ERRORS}/{name}")
        if data is None:
            raise LedgerError(f"{self.errors_dir}/{name}: missing; rerun with --overwrite")
        return data

    def delete_error_file(self, name: str) -> None:
        self.store.delete([f"{ERRORS}/{name}"])

    def read_part(self, name: str) -> bytes:
        data = self.store.get(name)
        if data is None:
            raise LedgerError(f"{self.store.url(name)}: a committed part is missing; rerun with --overwrite")
        return data

    def write_file(self, name: str, data: bytes) -> None:
        self.store.put(name, data)

    def write_success(
        self,
        fingerprint: str,
        inputs_failed: int,
        extra: Mapping[str, Any] | None = None,
        restated: Mapping[str, Part] | None = None,
    ) -> None:
        commits = list(restate(self.commits(), restated))  # one listing and GET of the records, read twice
        self.store.put(SUCCESS, "".join(success_chunks(lambda: commits, fingerprint, inputs_failed, extra)).encode())

    def write_private(self, name: str, data: Mapping[str, Any]) -> None:
        self.store.put(f"{PRIVATE}/{name}", json.dumps(data, indent=1).encode())

    def write_private_text(self, name: str, text: str) -> None:
        self.store.put(f"{PRIVATE}/{name}", text.encode())

    def read_private(self, name: str) -> dict[str, Any] | None:
        data = self.store.get(f"{PRIVATE}/{name}")
        return None if data is None else dict(json.loads(data))


def _dead_here(held: Mapping[str, Any]) -> bool:
    """The holder ran on this host and is gone: its process died, or it was an earlier run of
    this process that failed to release it (no need to wait for its lease)."""
    if held.get("host") != socket.gethostname():
        return False
    if held.get("pid") == os.getpid():
        return held.get("run") not in _HELD_HERE
    try:
        os.kill(int(held.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OSError):
        return False
    return int(held.get("pid", 0)) <= 0
