"""Review decisions also in PostgreSQL or Redis (``bulkinfer review --decisions-dsn``): each
decision written once, a write lost between the local commit and the mirror sent again at the
next start, never doubled."""

from __future__ import annotations

import json
import uuid

import pytest

from bulkinfer.core.errors import ConfigError
from bulkinfer.outputs.review import PostgresDecisions, RedisDecisions, ReviewStore, decisions_mirror

IDS = [f"r{i}" for i in range(4)]


def test_decisions_reach_postgres_once_and_a_lost_write_is_sent_at_the_next_start(tmp_path, postgres_server):
    table = f"decisions_{uuid.uuid4().hex[:8]}"

    def store() -> ReviewStore:
        mirror = decisions_mirror(postgres_server.dsn, table, "queue-a")
        assert isinstance(mirror, PostgresDecisions)
        return ReviewStore(tmp_path, IDS, 60, mirror=mirror)

    def in_postgres() -> list[tuple]:
        with postgres_server.connect() as c:
            return c.execute(f"SELECT queue, id, verdict, reviewer, note FROM {table} ORDER BY id").fetchall()

    def lose_r1() -> None:  # as if the process died between the local commit and PostgreSQL's
        with postgres_server.connect() as c:
            c.execute(f"DELETE FROM {table} WHERE id = 'r1'")

    check_mirror(store, in_postgres, lose_r1, lambda r: r[1])


def test_decisions_reach_redis_once_and_a_lost_write_is_sent_at_the_next_start(tmp_path, redis_server):
    import redis

    key = f"decisions_{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_server.url)

    def store() -> ReviewStore:
        mirror = decisions_mirror(redis_server.url, key, "queue-a")
        assert isinstance(mirror, RedisDecisions)
        return ReviewStore(tmp_path, IDS, 60, mirror=mirror)

    def in_redis() -> list[tuple]:
        found = {k.decode(): json.loads(v) for k, v in client.hgetall(f"{key}:queue-a").items()}
        return [(i, d["verdict"], d["reviewer"], d["note"]) for i, d in sorted(found.items())]

    check_mirror(store, in_redis, lambda: client.hdel(f"{key}:queue-a", "r1"), lambda r: r[0])
    assert client.keys(f"{key}*") == [f"{key}:queue-a".encode()]


def check_mirror(store, rows, lose_r1, row_id) -> None:
    first = store()
    first.decide("r0", "alice", "approve")
    first.decide("r1", "bob", "reject", "spam")
    first.close()
    found = rows()
    assert [row_id(r) for r in found] == ["r0", "r1"]
    assert [r[-3:] for r in found] == [("approve", "alice", ""), ("reject", "bob", "spam")]
    lose_r1()
    second = store()
    assert [row_id(r) for r in rows()] == ["r0", "r1"]  # sent again at start
    second.decide("r2", "alice", "approve")
    second.close()
    store().close()
    assert [row_id(r) for r in rows()] == ["r0", "r1", "r2"]  # each once


def test_a_mirror_that_is_neither_postgres_nor_redis_is_refused():
    with pytest.raises(ConfigError, match=r"--decisions-dsn: mysql:// is neither PostgreSQL .* nor Redis"):
        decisions_mirror("mysql://x/y", "t", "q")
    with pytest.raises(ConfigError, match=r"--decisions-dsn: cannot use Redis"):
        decisions_mirror("redis://127.0.0.1:1/0", "t", "q")
