"""Review decisions also in PostgreSQL (``bulkinfer review --decisions-dsn``): each decision
written once, a write lost between the local commit and PostgreSQL sent again at the next
start, never doubled."""

from __future__ import annotations

import uuid

from bulkinfer.outputs.review import PostgresDecisions, ReviewStore

IDS = [f"r{i}" for i in range(4)]


def test_decisions_reach_postgres_once_and_a_lost_write_is_sent_at_the_next_start(tmp_path, postgres_server):
    table = f"decisions_{uuid.uuid4().hex[:8]}"

    def store() -> ReviewStore:
        return ReviewStore(tmp_path, IDS, 60, mirror=PostgresDecisions(postgres_server.dsn, table, "queue-a"))

    def in_postgres() -> list[tuple]:
        with postgres_server.connect() as c:
            return c.execute(f"SELECT queue, id, verdict, reviewer, note FROM {table} ORDER BY id").fetchall()

    first = store()
    first.decide("r0", "alice", "approve")
    first.decide("r1", "bob", "reject", "spam")
    first.close()
    assert in_postgres() == [("queue-a", "r0", "approve", "alice", ""), ("queue-a", "r1", "reject", "bob", "spam")]
    with postgres_server.connect() as c:  # as if the process died between the local commit and PostgreSQL's
        c.execute(f"DELETE FROM {table} WHERE id = 'r1'")
    second = store()
    assert [r[1] for r in in_postgres()] == ["r0", "r1"]  # sent again at start
    second.decide("r2", "alice", "approve")
    second.close()
    store().close()
    assert [r[1] for r in in_postgres()] == ["r0", "r1", "r2"]  # each once
