"""The human-review queue of a finished job: the rows a route sent to review (its folder export),
the decisions people take on them, and who holds which row.

Decisions and leases live in SQLite beside the rows (``<queue>/_review/review.db``): a decision
is one row keyed by the queue row's id, written once (a second is refused, naming who took the
first); a row is leased to one reviewer at a time for ``lease_s`` seconds. After each decision
``<queue>/_review/decisions.parquet`` is rewritten from the database (a temporary file renamed
over the old), so ``bulkinfer compare`` and any Parquet reader see the decisions.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..core.errors import BulkinferError, ConfigError
from ..finished.read import private_json

log = logging.getLogger("bulkinfer")

__all__ = ["DECISIONS", "VERDICTS", "Conflict", "ReviewStore", "decisions_mirror", "queue_folder", "sent_by"]

VERDICTS = ("approve", "reject")
"""approve: the row may be published (the rule sent it for nothing); reject: it may not."""
DECISIONS = "_review/decisions.parquet"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (id TEXT PRIMARY KEY, verdict TEXT NOT NULL, note TEXT NOT NULL,
                                      reviewer TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, reviewer TEXT NOT NULL, until REAL NOT NULL);
"""


class Conflict(BulkinferError):
    """A decision that cannot be taken: the row is not in the queue (``status`` 404), or another
    reviewer holds or decided it (409); the message names who."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def queue_folder(out: str, route: str) -> tuple[Path, dict[str, Any]]:
    """The folder a finished job's route ``route`` wrote its rows to, and the job's config. A
    relative folder is found from here, else beside the output."""
    job = private_json(out, "job.json")
    if job is None:
        raise ConfigError(f"{out}: not an output of bulkinfer run (no _bulkinfer/job.json); give the job's output")
    config = job.get("config") or {}
    routes = {r["name"]: r for r in config.get("route") or []}
    if route not in routes:
        raise ConfigError(f"--route {route}: the job has no such route (its routes: {', '.join(routes) or 'none'})")
    folders = [e["path"] for e in routes[route]["export"] if e.get("kind") == "folder"]
    if not folders:
        raise ConfigError(f"--route {route}: its rows go to no folder export; a review queue reads a folder's parts")
    folder = Path(folders[0])
    if not folder.is_absolute() and not folder.is_dir():
        folder = Path(out).resolve().parent / folder
    if not folder.is_dir():
        raise ConfigError(f"--route {route}: its folder {folders[0]} is not here (nor beside {out}); has the job run?")
    return folder, config


def sent_by(config: Mapping[str, Any], route: str, row: pa.Table) -> str:
    """What sent a (one-row) table to review: the first decision rule that holds on it, else why
    no rule did (a model failed: ``on_error``; else ``default``); without decision rules, the
    route's own ``when``."""
    from ..core.expr import ExprError, mask, parse

    decision = config.get("decision")
    if not decision:
        return str(next(r["when"] for r in config.get("route") or [] if r["name"] == route))
    for outcome, when in decision["rules"].items():
        try:
            if mask(parse(when), row)[0].as_py():
                return f"{outcome}: {when}"
        except ExprError:  # a column the rows do not keep: this rule cannot be shown to hold
            continue
    if any(row.column(c)[0].is_valid for c in row.column_names if c.endswith(".error")):
        return f"{decision['on_error']}: decision.on_error (a model failed on the row, no rule held)"
    return f"{decision['default']}: decision.default (no rule held)"


@dataclass(frozen=True)
class Decision:
    id: str
    verdict: str
    note: str
    reviewer: str
    at: float


class PostgresDecisions:
    """The decisions also in a PostgreSQL table, keyed by (queue, id): each written once however
    often it is sent (``ON CONFLICT DO NOTHING``), so the store sends every decision again at
    start and after a failed write: none is lost, none doubled."""

    def __init__(self, dsn: str, table: str, queue: str) -> None:
        import psycopg

        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", table):
            raise ConfigError(f"--decisions-table {table!r}: a table name (schema.table allowed)")
        self.table, self.queue = table, queue
        try:
            self.conn = psycopg.connect(dsn, connect_timeout=5, autocommit=True)
            self.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (queue text NOT NULL, id text NOT NULL, verdict text NOT NULL, "
                "note text NOT NULL, reviewer text NOT NULL, at double precision NOT NULL, PRIMARY KEY (queue, id))"
            )
        except psycopg.Error as exc:
            raise ConfigError(f"--decisions-dsn: cannot use PostgreSQL ({' '.join(str(exc).split())[:200]})") from None

    def put(self, decisions: list[Decision]) -> None:
        rows = [(self.queue, d.id, d.verdict, d.note, d.reviewer, d.at) for d in decisions]
        with self.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {self.table} VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", rows)

    def errors(self) -> tuple[type[Exception], ...]:
        import psycopg

        return (psycopg.Error,)

    def close(self) -> None:
        self.conn.close()


class RedisDecisions:
    """The decisions also in a Redis hash (``<key>:<queue>``, a field per row id holding the
    decision as JSON), each written once (``HSETNX``): sent again at start and after a failed
    write, never doubled, as :class:`PostgresDecisions`."""

    def __init__(self, url: str, key: str, queue: str) -> None:
        import redis

        self.key = f"{key}:{queue}"
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            self.client.ping()
        except redis.RedisError as exc:
            raise ConfigError(f"--decisions-dsn: cannot use Redis ({' '.join(str(exc).split())[:200]})") from None

    def put(self, decisions: list[Decision]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for d in decisions:
            pipe.hsetnx(self.key, d.id, json.dumps({k: v for k, v in d.__dict__.items() if k != "id"}))
        pipe.execute()

    def errors(self) -> tuple[type[Exception], ...]:
        import redis

        return (redis.RedisError,)

    def close(self) -> None:
        self.client.close()


Mirror = PostgresDecisions | RedisDecisions


def decisions_mirror(dsn: str, table: str, queue: str) -> Mirror:
    """Where decisions also go: a PostgreSQL table (``postgresql://``) or a Redis hash
    (``redis://``, ``rediss://``; ``table`` names the hash before the queue's folder)."""
    scheme = dsn.split("://", 1)[0].lower()
    if scheme in ("redis", "rediss", "unix"):
        return RedisDecisions(dsn, table, queue)
    if scheme in ("postgresql", "postgres"):
        return PostgresDecisions(dsn, table, queue)
    raise ConfigError(f"--decisions-dsn: {scheme}:// is neither PostgreSQL (postgresql://) nor Redis (redis://)")


class ReviewStore:
    """The decisions and leases of one queue (see the module); ``ids``: the queue's rows in order;
    ``mirror``: a PostgreSQL table or Redis hash the decisions are also written to."""

    def __init__(
        self, folder: Path, ids: list[str], lease_s: float, clock: Callable[[], float] = time.time,
        mirror: Mirror | None = None,
    ) -> None:  # fmt: skip
        self.folder, self.ids, self.lease_s, self.clock, self.mirror = folder, ids, lease_s, clock, mirror
        self._known = set(ids)
        (folder / "_review").mkdir(exist_ok=True)
        self._db = sqlite3.connect(folder / "_review" / "review.db", isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._unsent = True  # every decision goes to the mirror at start (a crash may have left some unsent)
        self._export()
        self._send([])

    def lease(self, reviewer: str) -> str | None:
        """The row ``reviewer`` works on next: the one they hold, else the first nobody decided
        or holds (its lease starts now); None when every row is decided or held."""
        with self._lock, self._tx():
            now = self.clock()
            held = {i: (who, until) for i, who, until in self._db.execute("SELECT id, reviewer, until FROM leases")}
            decided = {i for (i,) in self._db.execute("SELECT id FROM decisions")}
            mine = [i for i in self.ids if i not in decided and held.get(i, ("", 0))[0] == reviewer]
            free = [i for i in self.ids if i not in decided and (i not in held or held[i][1] <= now)]
            chosen = (mine + free)[0] if mine or free else None
            if chosen is not None:
                lease = (chosen, reviewer, now + self.lease_s)
                self._db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?)", lease)
            return chosen

    def decide(self, row_id: str, reviewer: str, verdict: str, note: str = "") -> Decision:
        """Take the decision on ``row_id``, once: a row not in the queue, decided already, or held
        by someone else is a :class:`Conflict` naming who."""
        if verdict not in VERDICTS:
            raise Conflict(f"verdict {verdict!r}: expected one of {', '.join(VERDICTS)}", 400)
        if row_id not in self._known:
            raise Conflict(f"row {row_id!r} is not in this review queue", 404)
        with self._lock:
            with self._tx():
                done = self._db.execute("SELECT reviewer, at FROM decisions WHERE id = ?", (row_id,)).fetchone()
                if done is not None:
                    raise Conflict(f"row {row_id!r} was decided by {done[0]} at {_when(done[1])}")
                lease = self._db.execute("SELECT reviewer, until FROM leases WHERE id = ?", (row_id,)).fetchone()
                if lease is not None and lease[0] != reviewer and lease[1] > self.clock():
                    raise Conflict(f"row {row_id!r} is held by {lease[0]} until {_when(lease[1])}")
                decision = Decision(row_id, verdict, note, reviewer, self.clock())
                self._db.execute("INSERT INTO decisions VALUES (?, ?, ?, ?, ?)", tuple(decision.__dict__.values()))
                self._db.execute("DELETE FROM leases WHERE id = ?", (row_id,))
            self._export()
            self._send([decision])
        return decision

    def _send(self, rows: list[Decision]) -> None:
        """The decisions to the mirror: all of them after a failure (or at start), else ``rows``."""
        if self.mirror is None:
            return
        try:
            self.mirror.put(rows if not self._unsent else [Decision(*r) for r in self._all()])
            self._unsent = False
        except self.mirror.errors() as exc:
            self._unsent = True
            log.warning("review decisions: the %s write failed (%s); sent again with the next decision",
                        type(self.mirror).__name__, " ".join(str(exc).split())[:200])  # fmt: skip

    def decisions(self) -> dict[str, Decision]:
        with self._lock:
            rows = self._db.execute("SELECT id, verdict, note, reviewer, at FROM decisions ORDER BY at").fetchall()
        return {r[0]: Decision(*r) for r in rows}

    def holders(self) -> dict[str, str]:
        """Who holds which row now."""
        with self._lock:
            rows = self._db.execute("SELECT id, reviewer FROM leases WHERE until > ?", (self.clock(),)).fetchall()
        return dict(rows)

    def _all(self) -> list[tuple[Any, ...]]:
        return self._db.execute("SELECT id, verdict, note, reviewer, at FROM decisions ORDER BY at").fetchall()

    def _tx(self) -> Any:
        return _Transaction(self._db)

    def _export(self) -> None:
        """decisions.parquet from the database: written aside, renamed over the old one."""
        import pyarrow.parquet as pq

        rows = self._all()
        names = ["id", "verdict", "note", "reviewer", "at"]
        schema = pa.schema([(n, pa.float64() if n == "at" else pa.string()) for n in names])
        table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}, schema=schema)
        path = self.folder / DECISIONS
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)

    def close(self) -> None:
        self._db.close()
        if self.mirror is not None:
            self.mirror.close()


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an error): one writer at a time."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
