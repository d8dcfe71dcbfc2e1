"""The output directory's state: the only code that decides what is done.

Layout (``_bulkinfer/`` is private)::

    out/part-00000.parquet ...      committed parts (after rename)
    out/_SUCCESS                    manifest, written last
    out/_errors/part-00000.jsonl    one record per failed row of that part
    out/_bulkinfer/job.json         job fingerprint, config, inputs and the shard plan
    out/_bulkinfer/commits.log      append-only, one checksummed line per committed part
    out/_bulkinfer/lock             flock()ed by the live run; names its pid and host

A part is committed when its line is in ``commits.log``. A crash between the rename and
the append leaves a complete but uncommitted part: the next run removes it and redoes
the shard, so every row ends up in the output exactly once. State grows with the number
of shards, never with rows.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ..core.errors import JobMismatchError, LedgerError, LockedError, OutputError
from ..core.layout import ERRORS, PRIVATE, SUCCESS
from ..core.locks import try_lock
from ..core.records import ErrorRecord, encode_records
from ..plan import JobPlan, describe_change
from ..sinks import Part, write_bytes

__all__ = [
    "ERRORS",
    "PRIVATE",
    "SUCCESS",
    "Commit",
    "CommitTally",
    "Ledger",
    "OutputLedger",
    "restate",
    "success_chunks",
]


@dataclass(frozen=True, slots=True)
class Commit:
    """Rows ``[start, stop)`` of shard ``shard`` are done: ``rows`` of them are in ``file``
    (empty when none succeeded), ``errors`` failed and are described in ``error_file``."""

    shard: int
    start: int
    stop: int
    file: str
    rows: int
    bytes: int
    sha256: str
    errors: int = 0
    error_file: str | None = None
    replaces: str | None = None  # the error file a --retry-errors commit supersedes
    routed: int = 0  # rows sent to routes' targets instead of ``file``

    @classmethod
    def of(
        cls,
        shard: int,
        start: int,
        stop: int,
        part: Part | None,
        errors: int = 0,
        error_file: str | None = None,
        replaces: str | None = None,
        routed: int = 0,
    ) -> Commit:
        """The record of a commit of ``part`` (None: no row of the range succeeded)."""
        p = part or Part(name="", rows=0, bytes=0, sha256="")
        return cls(shard, start, stop, p.name, p.rows, p.bytes, p.sha256, errors, error_file, replaces, routed)


def _encode_line(record: Mapping[str, Any]) -> str:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return f"{zlib.crc32(body.encode()):08x} {body}\n"


def _decode_line(line: str, where: str) -> dict[str, Any]:
    crc, _, body = line.rstrip("\n").partition(" ")
    if not body or f"{zlib.crc32(body.encode()):08x}" != crc:
        raise LedgerError(
            f"{where}: checksum mismatch; the ledger is corrupt, refusing to guess what is done. "
            "Rerun with --repair to rebuild it from the committed files"
        )
    data: dict[str, Any] = json.loads(body)
    return data


def _write_atomic(path: Path, text: str | Iterable[str], crash_at: str | None = None) -> None:
    """``text`` (or its chunks, never joined: a million shards' job.json or _SUCCESS) in place atomically."""
    data = text.encode("utf-8") if isinstance(text, str) else (chunk.encode("utf-8") for chunk in text)
    write_bytes(path.parent, path.name, data, 0, crash_at=crash_at, what="it")


_DERIVED = ("_delta_log", "_batch_output.jsonl", "_batch_errors.jsonl")  # a Delta sink's log, Batch API files


def _is_ours(name: str) -> bool:
    return name.startswith(("part-", ".part-", "._SUCCESS")) or name in (
        SUCCESS,
        PRIVATE,
        ERRORS,
        "_delta_log",
        "_batch_output.jsonl",
        "_batch_errors.jsonl",
        "array.zarr",  # a grid job's array output (sinks.zarr)
    )


class OutputLedger(Protocol):
    """What a run needs of an output's ledger: :class:`Ledger` for a folder,
    :class:`~bulkinfer.commit.objledger.ObjectLedger` for an object-store prefix."""

    out_dir: Any
    errors_dir: Any
    took_over_from: str | None
    holds_records: bool
    """Whether a fold of its commits keeps the records (:class:`CommitTally`): an object store's
    ledger needs them to roll a half-done commit forward; a folder's never holds them."""

    def __enter__(self) -> OutputLedger: ...
    def __exit__(self, *exc: object) -> None: ...
    def read_plan(self) -> JobPlan | None: ...
    def begin(self, plan: JobPlan, overwrite: bool, stored: JobPlan | None) -> JobPlan: ...
    def commits(self, repair: bool = True) -> list[Commit]: ...
    def iter_commits(self, repair: bool = True) -> Iterator[Commit]:
        """The commits one at a time (a folder's log is read as it goes)."""
        ...

    def commit(self, record: Commit) -> Commit:
        """Record ``record`` (built with :meth:`Commit.of`): from then on its rows are done."""
        ...

    def commit_many(self, records: Sequence[Commit]) -> None:
        """Record several at once (a folder: one append, one fsync); a failure may leave any
        prefix of them recorded (:meth:`commits` says which)."""
        ...

    def remove_uncommitted(self, committed: CommitTally, keep: Iterable[str] = ()) -> list[str]: ...
    def write_input_errors(self, records: list[ErrorRecord]) -> None: ...
    def read_error_file(self, name: str) -> bytes: ...
    def delete_error_file(self, name: str) -> None: ...
    def write_success(
        self,
        fingerprint: str,
        inputs_failed: int,
        extra: Mapping[str, Any] | None = None,
        restated: Mapping[str, Part] | None = None,
    ) -> None: ...
    def write_file(self, name: str, data: bytes) -> None: ...
    def write_private(self, name: str, data: Mapping[str, Any]) -> None: ...
    def write_private_text(self, name: str, text: str) -> None: ...
    def read_private(self, name: str) -> dict[str, Any] | None: ...
    def read_part(self, name: str) -> bytes: ...


class JobStart:
    """How both ledgers (a folder's, :class:`Ledger`; an object store's,
    :class:`~bulkinfer.commit.objledger.ObjectLedger`) start or resume a job: the stored plan is
    kept when it is the same job, a different one is refused unless ``overwrite``, and a new job
    never lands among files bulkinfer did not write."""

    out_dir: Any
    fresh_output = "choose an empty or new --output"

    def foreign(self) -> list[str]:
        raise NotImplementedError

    def wipe(self) -> None:
        raise NotImplementedError

    def start_job(self, plan: JobPlan) -> None:
        raise NotImplementedError

    def begin(self, plan: JobPlan, overwrite: bool, stored: JobPlan | None) -> JobPlan:
        """Start or resume ``plan``'s job here; return the plan in force (the stored one on a
        resume). ``stored``: this output's plan as the caller read it under the lock (once: the
        draft ``plan`` was made from it too)."""
        if stored is not None and stored.fingerprint == plan.fingerprint:
            return stored
        if stored is not None and not overwrite:
            raise JobMismatchError(
                f"{self.out_dir}: holds a different job ({describe_change(stored, plan)}); "
                "rerun with --overwrite to discard it, or choose another --output"
            )
        foreign = self.foreign()
        if foreign and not overwrite:
            raise OutputError(
                f"{self.out_dir}: not empty and not a bulkinfer output (has {foreign[0]}); {self.fresh_output}"
            )
        self.wipe()
        self.start_job(plan)
        return plan


class Ledger(JobStart):
    """Lock, job identity and commit log of one output directory."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.private = out_dir / PRIVATE
        self.job_path = self.private / "job.json"
        self.log_path = self.private / "commits.log"
        self.errors_dir = out_dir / ERRORS
        self._lock_fh: Any = None
        self.took_over_from: str | None = None
        self.holds_records = False

    # -- lock ---------------------------------------------------------------
    def __enter__(self) -> Ledger:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the directory's lock; a lock left by a dead process is free (flock dies with it)."""
        self.private.mkdir(parents=True, exist_ok=True)
        fh, previous = try_lock(self.private / "lock")
        if fh is None:
            raise LockedError(
                f"{self.out_dir}: another run is writing here ({previous or 'another process'}); "
                "wait for it, or use another --output"
            )
        if previous:
            self.took_over_from = previous
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        fh.flush()
        self._lock_fh = fh

    def live_holder(self) -> str | None:
        """Who holds the lock now, or None when no live process does."""
        path = self.private / "lock"
        if not path.is_file():
            return None
        with open(path, encoding="utf-8") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return fh.read().strip() or "unknown"
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return None

    def release(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.seek(0)
            self._lock_fh.truncate()
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # -- job identity -------------------------------------------------------
    def read_plan(self) -> JobPlan | None:
        """The plan of the job this output holds, or None when it holds none."""
        if not self.job_path.is_file():
            return None
        try:
            with open(self.job_path, encoding="utf-8") as fh:
                return JobPlan.from_lines(fh)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"{self.job_path}: unreadable ({exc}); rerun with --overwrite") from exc

    def foreign(self) -> list[str]:
        """The names here that bulkinfer did not write."""
        return [p.name for p in self.out_dir.iterdir() if not _is_ours(p.name)]

    def start_job(self, plan: JobPlan) -> None:
        """Record ``plan`` as this output's job, with an empty commit log."""
        _write_atomic(self.job_path, plan.json_chunks())
        self.log_path.touch()

    def wipe(self) -> None:
        """Remove everything bulkinfer wrote here, except the lock held by this run."""
        for p in self.out_dir.iterdir():
            if p.name == PRIVATE:
                for q in p.iterdir():
                    if q.name != "lock":
                        shutil.rmtree(q) if q.is_dir() else q.unlink()
            elif _is_ours(p.name):
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    # -- commits ------------------------------------------------------------
    def commits(self, repair: bool = True) -> list[Commit]:
        """Every committed part (:meth:`iter_commits`, as a list)."""
        return list(self.iter_commits(repair))

    def iter_commits(self, repair: bool = True) -> Iterator[Commit]:
        """Every committed part, one at a time as the log is read (a million records are never
        held at once by a reader that folds them); a torn last line (a crash mid-append) is
        dropped, and cut off once the log is read to its end."""
        if not self.log_path.exists():
            return
        whole = n = 0  # bytes of the complete lines; lines read
        with open(self.log_path, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break  # torn: the tail after the last line end
                whole += len(raw)
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if line:
                    n += 1
                    yield Commit(**_decode_line(line, f"{self.log_path}:{n}"))
            torn = fh.seek(0, os.SEEK_END) > whole
        if torn and repair:
            with open(self.log_path, "r+b") as fh:
                fh.truncate(whole)
                os.fsync(fh.fileno())

    def commit(self, record: Commit) -> Commit:
        self.commit_many([record])
        return record

    def commit_many(self, records: Sequence[Commit]) -> None:
        """The records' lines in one append and one fsync (a group commit: the driver of a
        cluster commits many small shards a second)."""
        data = "".join(_encode_line(asdict(r)) for r in records).encode()
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while data:  # a regular file takes the whole append; a short write is finished, never dropped
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        except OSError as exc:
            raise OutputError(
                f"{self.log_path}: cannot record the commit ({exc.strerror or exc}); rerun to resume"
            ) from exc
        finally:
            os.close(fd)

    def remove_uncommitted(self, committed: CommitTally, keep: Iterable[str] = ()) -> list[str]:
        """Delete temp files, parts and error files that no ledger line vouches for (nor ``keep``:
        parts a Delta table's log holds); return their names."""
        keep = committed.names | set(keep)
        keep_errors = set(committed.active_error_files())
        removed = []
        for p in self.out_dir.iterdir():
            stale_part = p.name.startswith("part-") and p.name not in keep
            if stale_part or p.name.startswith((".part-", "._SUCCESS")):
                p.unlink()
                removed.append(p.name)
        if self.errors_dir.is_dir():
            for p in self.errors_dir.iterdir():
                if p.name.startswith(".") or (p.name.startswith("part-") and p.name not in keep_errors):
                    p.unlink()
                    removed.append(f"{ERRORS}/{p.name}")
        return removed

    def write_input_errors(self, records: list[ErrorRecord]) -> None:
        """``_errors/inputs.jsonl``: the input files that could not be planned (part of the plan)."""
        self.errors_dir.mkdir(exist_ok=True)
        _write_atomic(self.errors_dir / "inputs.jsonl", encode_records(records).decode())

    def write_success(
        self,
        fingerprint: str,
        inputs_failed: int,
        extra: Mapping[str, Any] | None = None,
        restated: Mapping[str, Part] | None = None,
    ) -> None:
        """``_SUCCESS``, written last: every committed file with its rows, bytes and checksum
        (``restated``: those of parts the finish step rewrote)."""
        chunks = success_chunks(lambda: restate(self.iter_commits(), restated), fingerprint, inputs_failed, extra)
        _write_atomic(self.out_dir / SUCCESS, chunks, crash_at="success-temp-written")

    def write_file(self, name: str, data: bytes) -> None:
        """A file of the output's own beside the parts (``_deleted.parquet``), atomically."""
        write_bytes(self.out_dir, name, data, 0, crash_at=None, what="it")

    def read_error_file(self, name: str) -> bytes:
        return (self.errors_dir / name).read_bytes()

    def read_part(self, name: str) -> bytes:
        return (self.out_dir / name).read_bytes()

    def delete_error_file(self, name: str) -> None:
        (self.errors_dir / name).unlink(missing_ok=True)

    def read_private(self, name: str) -> dict[str, Any] | None:
        path = self.private / name
        return dict(json.loads(path.read_text())) if path.is_file() else None

    def write_private_text(self, name: str, text: str) -> None:
        _write_atomic(self.private / name, text)

    def replace_log(self, commits: Iterable[Commit]) -> None:
        """Swap in a rebuilt commit log (``--repair``); the old one is kept beside it."""
        if self.log_path.exists():
            os.replace(self.log_path, self.log_path.with_name(f"commits.log.corrupt-{int(time.time())}"))
        _write_atomic(self.log_path, "".join(_encode_line(asdict(c)) for c in commits))

    def write_private(self, name: str, data: Mapping[str, Any]) -> None:
        (self.private / name).parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.private / name, json.dumps(data, indent=1))


def restate(commits: Iterable[Commit], restated: Mapping[str, Part] | None) -> Iterator[Commit]:
    """``commits``, with the rows, bytes and checksum of each part in ``restated`` (rewritten since)."""
    for c in commits:
        p = restated.get(c.file) if restated else None
        yield c if p is None else replace(c, rows=p.rows, bytes=p.bytes, sha256=p.sha256)


def success_chunks(
    commits: Callable[[], Iterable[Commit]],
    fingerprint: str,
    inputs_failed: int,
    extra: Mapping[str, Any] | None = None,
) -> Iterator[str]:
    """What ``_SUCCESS`` says, as written: the job, its row counts, its error files (and
    ``extra``), then every committed file with its rows, bytes, checksum and rows range, in
    shard order, last, one a line. ``commits`` gives the commits each time it is called: they
    are read twice (the counts first, then the files), so a log already in shard order (a local
    run's) is never held whole; one out of order (a cluster's) is sorted in memory."""
    tally = CommitTally.of(commits(), names=False, ranges=False)
    head = json.dumps({**tally.fields(fingerprint, inputs_failed), **(extra or {})}, indent=1)
    yield head[: -len("\n}")] + ',\n "files":[\n'
    files: Iterable[Commit] = (c for c in commits() if c.file)
    if not tally.in_order:
        files = sorted(files, key=_shard_order)
    last = tally.files - 1
    for i, c in enumerate(files):
        yield json.dumps(_success_file(c), separators=(",", ":")) + (",\n" if i < last else "\n")
    yield "]}\n"


def _shard_order(c: Commit) -> tuple[int, int]:
    return c.shard, c.start


class CommitTally:
    """The commit log folded one record at a time, never held: row counts, the error files in
    force, and, unless turned off, the committed files' names (``names``) and every commit's
    row range (three integer arrays, 24 bytes a commit). ``records`` keeps the records
    themselves only when asked (an object store's ledger, which fetches them together anyway
    and rolls a half-done commit forward)."""

    def __init__(self, keep_records: bool = False, names: bool = True, ranges: bool = True) -> None:
        self.rows = self.routed = self.files = 0
        self.in_order = True
        self._last = (-1, -1)
        self._superseded: set[str] = set()
        self._errors: list[tuple[tuple[int, int], str, int]] = []  # (order, error file, rows failed)
        self.names: set[str] = set()
        self.shard, self.start, self.stop = array("q"), array("q"), array("q")
        self.records: list[Commit] | None = [] if keep_records else None
        self._names, self.has_ranges = names, ranges

    @classmethod
    def of(
        cls, commits: Iterable[Commit], keep_records: bool = False, names: bool = True, ranges: bool = True
    ) -> CommitTally:
        tally = cls(keep_records, names, ranges)
        for c in commits:
            tally.add(c)
        return tally

    def add(self, c: Commit) -> None:
        self.rows += c.rows
        self.routed += c.routed
        key = _shard_order(c)
        if self.has_ranges:
            self.shard.append(c.shard)
            self.start.append(c.start)
            self.stop.append(c.stop)
        if c.file:
            self.files += 1
            if self._names:
                self.names.add(c.file)
            self.in_order = self.in_order and key >= self._last
            self._last = key
        if c.replaces:
            self._superseded.add(c.replaces)
        if c.error_file:
            self._errors.append((key, c.error_file, c.errors))
        if self.records is not None:
            self.records.append(c)

    def _active(self) -> list[tuple[str, int]]:
        return [(name, n) for _, name, n in sorted(self._errors) if name not in self._superseded]

    def active_error_files(self) -> list[str]:
        """Error files in force (no later --retry-errors commit superseded them), in shard order."""
        return [name for name, _ in self._active()]

    @property
    def failed_rows(self) -> int:
        """Rows that failed and were not fixed by a retry."""
        return sum(n for _, n in self._active())

    def fields(self, fingerprint: str, inputs_failed: int) -> dict[str, Any]:
        """``_SUCCESS``'s fields but its files."""
        active = self._active()
        return {
            "job_fingerprint": fingerprint,
            "completed": time.time(),
            "rows": self.rows,
            "rows_routed": self.routed,
            "rows_failed": sum(n for _, n in active),
            "inputs_failed": inputs_failed,
            "error_files": [f"{ERRORS}/{name}" for name, _ in active]
            + ([f"{ERRORS}/inputs.jsonl"] if inputs_failed else []),
        }


def _success_file(c: Commit) -> dict[str, Any]:
    return {
        "name": c.file,
        "rows": c.rows,
        "bytes": c.bytes,
        "sha256": c.sha256,
        "shard": c.shard,
        "start": c.start,
        "stop": c.stop,
    }
