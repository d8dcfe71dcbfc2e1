"""Export targets against real servers: redis-server and PostgreSQL with pgvector, started by
the fixtures; the real clients (redis-py, psycopg) over sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer import OutputError, run_job

from helpers import BULKINFER, cli, job_config, read_output, wait_commits, write

MODEL = """
import os
import time

import numpy as np


def embed(table):
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float32)
    if os.environ.get("SLOW_MODEL"):
        time.sleep(float(os.environ["SLOW_MODEL"]))
    kill_at = os.environ.get("KILL_PG_AT")
    if kill_at and int(kill_at) in table.column("x").to_pylist():
        import psycopg
        with psycopg.connect(os.environ["PG_DSN"], autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE pid <> pg_backend_pid() AND datname = current_database()")
    return {"embedding": np.stack([x, 2 * x, x + 1, -x], axis=1), "score": x / 1000.0}
"""


def expected_vector(i: int) -> np.ndarray:
    return np.array([i, 2 * i, i + 1, -i], dtype=np.float32)


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A 250-row input in shards of 50 and a cheap model (``model:embed``) in the working directory."""
    write(pa.table({"id": np.arange(250), "x": np.arange(250)}), tmp_path / "in.parquet")
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("model", None)

    def config(out: str = "out", **overrides):
        base = {"source.shard_rows": 50, "model.name": "model:embed", "model.feature_columns": ["x"],
                "runtime.batch_size": 25}  # fmt: skip
        return job_config(out, ["in.parquet"], **{**base, **overrides})

    return config


def toml(exports: list[dict]) -> str:
    """``exports`` as a TOML array of inline tables (what --set export=... takes)."""
    return "[" + ", ".join("{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in e.items()) + "}" for e in exports) + "]"


# -- Redis ---------------------------------------------------------------------------------


def test_redis_export_writes_every_row_under_the_version_then_switches_the_pointer(job, redis_server):
    prefix = f"t{uuid.uuid4().hex[:6]}:"
    cfg = job(export=[{"kind": "redis", "url": redis_server.url, "key": prefix + "{id}", "columns": ["embedding"]}])
    result = run_job(cfg)
    r = redis_server.client()
    version = r.get(prefix + "current").decode()
    assert version == json.loads((result.output / "_SUCCESS").read_text())["job_fingerprint"][:16]
    keys = {k.decode() for k in r.scan_iter(match=f"{prefix}{version}:*", count=1000)}
    assert keys == {f"{prefix}{version}:{i}" for i in range(250)}
    for i in (0, 7, 249):
        assert np.frombuffer(r.get(f"{prefix}{version}:{i}"), dtype=np.float32).tolist() == expected_vector(i).tolist()
    exports = result.report["exports"]
    assert list(exports) == [f"export[0] (redis {redis_server.url})"]
    assert exports[f"export[0] (redis {redis_server.url})"]["rows"] == 250


def test_redis_hash_and_json_encodings(job, redis_server):
    prefix = f"h{uuid.uuid4().hex[:6]}:"
    cfg = job(
        export=[
            {"kind": "redis", "url": redis_server.url, "key": prefix + "{id}", "versioned": False},
            {"kind": "redis", "url": redis_server.url, "key": "j" + prefix + "{id}", "encoding": "json",
             "columns": ["score"], "versioned": False, "ttl_s": 600},
        ],
        **{"sink.input_hash": True},
    )  # fmt: skip
    run_job(cfg)
    assert "_input_hash" in read_output(Path("out")).column_names  # the output keeps its rows' input hashes
    r = redis_server.client()
    h = r.hgetall(f"{prefix}12")
    assert set(h) == {b"embedding", b"score"}  # an export stores the model's outputs, not the hashes
    assert np.frombuffer(h[b"embedding"], dtype=np.float32).tolist() == expected_vector(12).tolist()
    assert float(h[b"score"]) == pytest.approx(0.012)
    assert json.loads(r.get(f"j{prefix}12")) == {"score": pytest.approx(0.012)}
    assert 0 < r.ttl(f"j{prefix}12") <= 600
    assert r.get(prefix + "current") is None  # not versioned: no pointer


def test_redis_versions_switch_atomically_and_old_ones_are_deleted(job, redis_server, tmp_path):
    prefix = f"v{uuid.uuid4().hex[:6]}:"
    spec = {"kind": "redis", "url": redis_server.url, "key": prefix + "{id}", "keep_versions": 2}
    r = redis_server.client()
    versions = []
    for run in range(3):  # three nightly runs over changed data: three versions
        write(pa.table({"id": np.arange(250), "x": np.arange(250) + run}), tmp_path / "in.parquet")
        run_job(job(out=f"out{run}", export=[spec]))
        versions.append(r.get(prefix + "current").decode())
    assert len(set(versions)) == 3
    assert [v.decode() for v in r.zrevrange(prefix + "versions", 0, -1)] == versions[:0:-1]
    assert not list(r.scan_iter(match=f"{prefix}{versions[0]}:*"))  # the oldest is gone
    assert len(list(r.scan_iter(match=f"{prefix}{versions[1]}:*", count=1000))) == 250  # the previous one stays


def test_redis_down_at_start_is_one_line_before_any_inference(job, tmp_path):
    from services import free_port

    cfg = job(export=[{"kind": "redis", "url": f"redis://127.0.0.1:{free_port()}/0", "key": "x:{id}"}])
    with pytest.raises(OutputError, match=r"export\[0\] \(redis redis://127\.0\.0\.1:\d+/0\): cannot reach it"):
        run_job(cfg)
    assert (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text() == ""
    report = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())
    assert report["status"] == "failed" and report["batches"]["count"] == 0  # no batch was even planned


def test_redis_killed_mid_run_stops_the_job_and_the_rerun_completes_exactly_once(job, tmp_path):
    from services import RedisServer

    server = RedisServer(tmp_path / "r", durable=True)
    try:
        prefix = "k:"
        exports = toml([{"kind": "redis", "url": server.url, "key": prefix + "{id}"}])
        args = ["run", "-i", "in.parquet", "-m", "model:embed", "--feature-columns", "x", "--id-column", "id",
                "-o", "out", "--progress", "none", "--set", "source.shard_rows=50", "--set", "runtime.batch_size=25",
                "--set", f"export={exports}"]  # fmt: skip
        env = {**__import__("os").environ, "SLOW_MODEL": "0.15"}
        proc = subprocess.Popen([*BULKINFER, *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        wait_commits(tmp_path / "out", 1, proc)
        server.kill()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err
        assert "export[0] (redis redis://127.0.0.1" in err and "rerun to resume" in err
        committed = (tmp_path / "out" / "_bulkinfer" / "commits.log").read_text().count("\n")
        assert 1 <= committed < 5
        server.start()  # the same data (append-only file) back
        cli(*args, cwd=tmp_path, check=True)
        r = server.client()
        version = r.get(prefix + "current").decode()
        keys = list(r.scan_iter(match=f"{prefix}{version}:*", count=1000))
        assert sorted(int(k.decode().rsplit(":", 1)[1]) for k in keys) == list(range(250))
    finally:
        server.kill()


# -- PostgreSQL ----------------------------------------------------------------------------


def _table() -> str:
    return f"emb_{uuid.uuid4().hex[:8]}"


def test_postgres_append_copies_each_part_once_as_pgvector(job, postgres_server):
    table = _table()
    run_job(job(export=[{"kind": "postgres", "dsn": postgres_server.dsn, "table": table, "mode": "append"}]))
    with postgres_server.connect() as c:
        types = dict(
            c.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0",
                (table,),
            ).fetchall()
        )
        assert types == {"id": "bigint", "embedding": "vector(4)", "score": "double precision"}
        rows = c.execute(f"SELECT id, embedding::text, score FROM {table} ORDER BY id").fetchall()
        parts = c.execute("SELECT count(*) FROM bulkinfer_commits WHERE target = %s", (table,)).fetchone()[0]
    assert [r[0] for r in rows] == list(range(250))
    assert rows[7][1] == "[7,14,8,-7]" and rows[7][2] == pytest.approx(0.007)
    assert parts == 5


def test_postgres_replays_after_a_crash_inside_or_after_the_transaction_change_nothing(job, postgres_server, tmp_path):
    table = _table()
    exports = toml([{"kind": "postgres", "dsn": postgres_server.dsn, "table": table, "mode": "append"}])
    args = ["run", "-i", "in.parquet", "-m", "model:embed", "--feature-columns", "x", "--id-column", "id", "-o", "out",
            "--progress", "none", "--set", "source.shard_rows=50", "--set", f"export={exports}"]  # fmt: skip
    env = dict(__import__("os").environ)
    # killed after COPY, before the commit row (rolled back) / after the export, before the ledger line (replayed)
    for point in ("export-postgres-copied:2", "exported:3"):
        proc = subprocess.run([*BULKINFER, *args], cwd=tmp_path, env={**env, "BULKINFER_CRASH_AT": point},
                              capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == -9, proc.stderr
    cli(*args, cwd=tmp_path, check=True)
    with postgres_server.connect() as c:
        count, distinct = c.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
    assert count == distinct == 250


def test_postgres_upsert_keeps_one_row_per_id_and_survives_killed_connections(
    job, postgres_server, monkeypatch, caplog
):
    table = _table()
    spec = {"kind": "postgres", "dsn": postgres_server.dsn, "table": table, "mode": "upsert", "vector": "array"}
    monkeypatch.setenv("KILL_PG_AT", "120")  # the model terminates every other backend of the database at row 120
    monkeypatch.setenv("PG_DSN", postgres_server.dsn)
    run_job(job(export=[spec]))
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retried and all(table in m for m in retried)  # the export's connection was killed and redone
    monkeypatch.delenv("KILL_PG_AT")
    run_job(job(out="out2", export=[spec], **{"runtime.batch_size": 10}))  # another job into the same table
    with postgres_server.connect() as c:
        count, distinct = c.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
        kind = c.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attname = 'embedding'",
            (table,),
        ).fetchone()[0]
        emb = c.execute(f"SELECT embedding FROM {table} WHERE id = 9").fetchone()[0]
    assert count == distinct == 250
    assert kind == "real[]" and emb == expected_vector(9).tolist()


def test_postgres_refuses_an_existing_table_with_other_columns(job, postgres_server):
    table = _table()
    with postgres_server.connect() as c:
        c.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, embedding text)")
    with pytest.raises(OutputError, match=r"column 'embedding' is text in the table but the output has vector\(4\)"):
        run_job(job(export=[{"kind": "postgres", "dsn": postgres_server.dsn, "table": table}]))


def test_postgres_down_at_start_is_one_line(job):
    from services import free_port

    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(OutputError, match=r"export\[0\] \(postgres table t\): cannot connect"):
        run_job(job(export=[{"kind": "postgres", "dsn": dsn, "table": "t"}]))


def test_the_readme_export_example_runs(job, redis_server, postgres_server):
    import re
    import tomllib
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "outputs.md").read_text()
    block = re.search(r"<!-- export-example -->\n```toml\n(.*?)```", readme, re.S).group(1)
    exports = tomllib.loads(block)["export"]
    assert [e["kind"] for e in exports] == ["redis", "postgres"]
    exports[0]["url"], exports[1]["dsn"] = redis_server.url, postgres_server.dsn  # the servers of this test
    exports[1]["table"] = _table()
    run_job(job(export=exports))
    r = redis_server.client()
    version = r.get("emb:current").decode()
    assert np.frombuffer(r.get(f"emb:{version}:3"), dtype=np.float32).tolist() == expected_vector(3).tolist()
    with postgres_server.connect() as c:
        assert c.execute(f"SELECT count(*) FROM {exports[1]['table']}").fetchone()[0] == 250


def test_postgres_checks_the_whole_existing_table_before_any_row_and_points_at_the_setting(job, postgres_server):
    """An existing real[] column refused for a pgvector output names vector = 'array' (which then
    writes into it); a NOT NULL column without a default that the output lacks is refused before
    any row is sent, not at COPY time."""
    arrays, strict = _table(), _table()
    with postgres_server.connect() as c:
        c.execute(f"CREATE TABLE {arrays} (id bigint PRIMARY KEY, embedding real[], score double precision)")
        c.execute(f"CREATE TABLE {strict} (id bigint PRIMARY KEY, embedding vector(4), score double precision, "
                  "team text NOT NULL, at timestamptz NOT NULL DEFAULT now())")  # fmt: skip
    spec = {"kind": "postgres", "dsn": postgres_server.dsn}
    with pytest.raises(OutputError, match=r"column 'embedding' is real\[\] in the table but the output has "
                                          r"vector\(4\); set vector = 'array' to write real\[\] into it"):  # fmt: skip
        run_job(job("out1", export=[{**spec, "table": arrays}]))
    run_job(job("out2", export=[{**spec, "table": arrays, "vector": "array"}]))
    with postgres_server.connect() as c:
        assert c.execute(f"SELECT count(*) FROM {arrays}").fetchone()[0] == 250
    with pytest.raises(OutputError, match=r"the table's column 'team' is NOT NULL without a default and the output "
                                          r"has no such column"):  # fmt: skip
        run_job(job("out3", export=[{**spec, "table": strict}]))


def test_postgres_refusing_rows_quotes_them_only_without_redact(job, postgres_server):
    """A row the table refuses (a CHECK constraint): PostgreSQL's error quotes the row; under
    execution.redact the job's error withholds it."""
    table = _table()
    with postgres_server.connect() as c:
        c.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, embedding vector(4), "
                  "score double precision CHECK (score < 0.1))")  # fmt: skip
    spec = [{"kind": "postgres", "dsn": postgres_server.dsn, "table": table}]
    with pytest.raises(OutputError, match="Failing row contains"):
        run_job(job("plain", export=spec))
    with pytest.raises(OutputError) as err:
        run_job(job("hidden", export=spec, **{"execution.redact": True}))
    assert "Failing row" not in str(err.value) and "the message is withheld: execution.redact" in str(err.value)
