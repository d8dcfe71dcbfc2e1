"""Output to an object store (s3://) against a real S3 API server (moto's, started by the
fixtures), through the real client (s3fs/botocore) over sockets."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkinfer import LockedError, OutputError, run_job

from helpers import BULKINFER, job_config, race, write

MODEL = """
import os
import re
import time

import numpy as np


def embed(table):
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float32)
    if os.environ.get("SLOW_MODEL"):
        time.sleep(float(os.environ["SLOW_MODEL"]))
    return {"embedding": np.stack([x, 2 * x], axis=1), "score": x / 1000.0}
"""


@pytest.fixture
def s3job(tmp_path, monkeypatch, s3_server):
    """250 rows in shards of 50, a cheap model, and a fresh bucket; returns (config maker, bucket)."""
    write(pa.table({"id": np.arange(250), "x": np.arange(250)}), tmp_path / "in.parquet")
    (tmp_path / "s3model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("s3model", None)
    bucket = s3_server.bucket(f"b{uuid.uuid4().hex[:10]}")

    def config(path: str = "out", **overrides):
        base = {"source.shard_rows": 50, "model.name": "s3model:embed", "model.feature_columns": ["x"],
                "sink.storage_options": s3_server.options}  # fmt: skip
        return job_config(f"s3://{bucket}/{path}", ["in.parquet"], **{**base, **overrides})

    return config, bucket


def visible(s3, bucket: str, prefix: str) -> pa.Table:
    """What a downstream reader sees: every object under the prefix whose name does not start with _ or ."""
    keys = [k for k in s3.keys(bucket, prefix + "/") if not k.rsplit("/", 1)[1].startswith(("_", "."))]
    keys = [k for k in keys if "/_" not in k[len(prefix) :]]
    client = s3.client()
    tables = [pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=k)["Body"].read())) for k in keys]
    return pa.concat_tables(tables) if tables else pa.table({})


def test_a_job_writes_the_same_layout_to_a_bucket(s3job, s3_server):
    config, bucket = s3job
    result = run_job(config())
    assert result.output == f"s3://{bucket}/out"
    keys = s3_server.keys(bucket, "out/")
    assert [k for k in keys if k.startswith("out/part-")] == [f"out/part-{i:05d}.parquet" for i in range(5)]
    assert "out/_SUCCESS" in keys and "out/_bulkinfer/job.json" in keys
    assert [k for k in keys if "/_bulkinfer/commits/" in k] == [
        f"out/_bulkinfer/commits/{i:05d}-{50 * i:010d}.json" for i in range(5)
    ]
    assert not [k for k in keys if "_temporary" in k or k.endswith("/lock")]
    out = visible(s3_server, bucket, "out")
    assert sorted(out.column("id").to_pylist()) == list(range(250))
    manifest = json.loads(s3_server.client().get_object(Bucket=bucket, Key="out/_SUCCESS")["Body"].read())
    assert manifest["rows"] == 250 and len(manifest["files"]) == 5
    assert (
        json.loads(s3_server.client().get_object(Bucket=bucket, Key="out/_bulkinfer/report.json")["Body"].read())[
            "rows_out"
        ]
        == 250
    )


def test_a_missing_bucket_is_one_line_before_any_inference(s3job, s3_server):
    config, _bucket = s3job
    cfg = config()
    cfg = cfg.model_copy(update={"sink": cfg.sink.model_copy(update={"path": "s3://no-such-bucket-here/out"})})
    with pytest.raises(
        OutputError, match=r"^s3://no-such-bucket-here/out: the bucket 'no-such-bucket-here' does not exist"
    ):
        run_job(cfg)


def test_a_second_live_run_on_the_prefix_is_refused(s3job, s3_server):
    from bulkinfer.commit.objledger import ObjectLedger
    from bulkinfer.sinks.objects import ObjectStore

    config, bucket = s3job
    live = r"another run is writing here \(pid \d+ on .*renewed \d+ s ago\)"
    with ObjectLedger(ObjectStore(f"s3://{bucket}/out", s3_server.options)), pytest.raises(LockedError, match=live):
        run_job(config())
    assert run_job(config()).report["rows_out"] == 250
    assert sorted(visible(s3_server, bucket, "out").column("id").to_pylist()) == list(range(250))


def test_a_lease_nobody_renewed_is_taken_over(s3job, s3_server):
    """A run on another machine that died: its lock names a foreign host and was last renewed
    longer ago than the lease; the next run takes it over and completes."""
    from bulkinfer.commit.objledger import LEASE_S

    config, bucket = s3job
    stale = {"pid": 1, "host": "another-machine", "since": 0, "renewed": time.time() - LEASE_S - 1}
    s3_server.client().put_object(Bucket=bucket, Key="out/_bulkinfer/lock", Body=json.dumps(stale).encode())
    assert run_job(config()).report["rows_out"] == 250
    assert "out/_bulkinfer/lock" not in s3_server.keys(bucket, "out/")
    fresh = {**stale, "renewed": time.time()}
    s3_server.client().put_object(Bucket=bucket, Key="out/_bulkinfer/lock", Body=json.dumps(fresh).encode())
    with pytest.raises(LockedError, match=r"another run is writing here \(pid 1 on another-machine"):
        run_job(config())


@pytest.mark.parametrize("point", ["part-temp-written:3", "part-committed:2", "part-renamed:2"])
def test_sigkill_during_upload_or_publish_then_rerun_elsewhere_is_exactly_once(s3job, s3_server, tmp_path, point):
    """Input and output both in the bucket, the store configured the usual way (AWS_* variables),
    so the rerun from another working directory needs nothing but the store's content."""
    _config, bucket = s3job
    s3_server.client().put_object(Bucket=bucket, Key="in/in.parquet", Body=(tmp_path / "in.parquet").read_bytes())
    args = ["run", "-i", f"s3://{bucket}/in/", "-m", "s3model:embed", "--feature-columns", "x",
            "--id-column", "id", "-o", f"s3://{bucket}/out", "--progress", "none",
            "--set", "source.shard_rows=50"]  # fmt: skip
    env = {**os.environ, **s3_server.env, "BULKINFER_CRASH_AT": point}
    proc = subprocess.run([*BULKINFER, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    keys = s3_server.keys(bucket, "out/")
    assert "out/_SUCCESS" not in keys
    committed = [k for k in keys if "/commits/" in k]
    assert 1 <= len(committed) < 5
    # nothing a lister sees is uncommitted: every visible part is named by a commit record
    named = {json.loads(s3_server.get(bucket, k))["file"] for k in committed}
    assert {k.removeprefix("out/") for k in keys if k.startswith("out/part-")} <= named
    proc = subprocess.run(
        [*BULKINFER, "inspect", f"s3://{bucket}/out", "--json"], env=env, capture_output=True, text=True
    )
    info = json.loads(proc.stdout)
    assert (info["shards_committed"], info["rows_committed"], info["complete"], info["running"]) == (
        len(committed),
        50 * len(committed),
        False,
        False,
    )
    # another machine: a fresh working directory with only the model
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "s3model.py").write_bytes((tmp_path / "s3model.py").read_bytes())
    env.pop("BULKINFER_CRASH_AT")
    proc = subprocess.run([*BULKINFER, *args], cwd=other, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "took over the lock left by a run that died" in proc.stderr  # same host, its pid gone: no lease wait
    assert f"{len(committed) * 50} already committed" in proc.stdout
    out = visible(s3_server, bucket, "out")
    assert sorted(out.column("id").to_pylist()) == list(range(250))
    assert not [k for k in s3_server.keys(bucket, "out/") if "_temporary" in k or k.endswith("/lock")]


@pytest.fixture
def proxy(s3_server):
    from services import FaultProxy

    p = FaultProxy(s3_server.port)
    yield p
    p.down()


def through(s3_server, proxy, **retries) -> dict:
    """Storage options that reach moto through the fault proxy."""
    options = {**s3_server.options, "endpoint_url": proxy.endpoint}
    if retries:
        options["retries"] = retries["s3fs"]
        options["config_kwargs"] = {"retries": {"max_attempts": retries["botocore"], "mode": "standard"}}
    return options


def when_committed(s3_server, bucket: str, n: int, then) -> threading.Thread:
    """Run ``then()`` once ``n`` commit records exist under ``out/``."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len([k for k in s3_server.keys(bucket, "out/_bulkinfer/commits/")]) >= n:
                then()
                return
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_slowdown_answers_are_retried_and_every_row_lands_once(s3job, s3_server, proxy):
    config, bucket = s3job
    proxy.fail_every = 7  # one request in seven answered 503 SlowDown
    result = run_job(config(**{"sink.storage_options": through(s3_server, proxy)}))
    assert result.report["rows_out"] == 250
    assert proxy.refused >= 5
    assert sorted(visible(s3_server, bucket, "out").column("id").to_pylist()) == list(range(250))


def test_the_store_restarting_mid_run_costs_nothing(s3job, s3_server, proxy, monkeypatch):
    config, bucket = s3job
    monkeypatch.setenv("SLOW_MODEL", "0.3")

    def restart() -> None:
        proxy.down()  # open connections reset, new ones refused
        time.sleep(1.5)
        proxy.up()

    watcher = when_committed(s3_server, bucket, 1, restart)
    result = run_job(config(**{"sink.storage_options": through(s3_server, proxy)}))
    watcher.join()
    # the restart happened mid-run: open connections were reset, and the job came back through new ones
    assert proxy.resets >= 1 and proxy.served > proxy.served_before_down > 0
    assert result.report["rows_out"] == 250
    assert sorted(visible(s3_server, bucket, "out").column("id").to_pylist()) == list(range(250))


def test_a_store_that_keeps_failing_stops_the_job_with_one_line_and_keeps_what_was_committed(
    s3job, s3_server, proxy, monkeypatch
):
    config, bucket = s3job
    monkeypatch.setenv("SLOW_MODEL", "0.3")

    def fail_everything() -> None:
        proxy.fail_every = 1

    watcher = when_committed(s3_server, bucket, 2, fail_everything)
    options = through(s3_server, proxy, s3fs=1, botocore=1)  # one try each: the failures come at once
    with pytest.raises(OutputError) as err:
        run_job(config(**{"sink.storage_options": options}))
    watcher.join()
    message = str(err.value)
    assert "\n" not in message
    # the store's answer: a 503 SlowDown, or to a HEAD (no body) only its status
    said = r"\(503 (SlowDown: Please reduce your request rate\.|Service Unavailable)\)"
    assert re.match(rf"^s3://{bucket}/out/[^/ ]+(/\S+)?: cannot [a-z ]+ {said}", message), message
    assert "committed shards are kept, rerun to resume" in message
    committed = len(s3_server.keys(bucket, "out/_bulkinfer/commits/"))
    assert committed >= 2
    proxy.fail_every = 0
    result = run_job(config(**{"sink.storage_options": options}))
    assert result.report["rows_already_done"] == committed * 50
    assert sorted(visible(s3_server, bucket, "out").column("id").to_pylist()) == list(range(250))


def test_an_index_is_built_from_an_output_in_the_bucket(s3job, s3_server, tmp_path, monkeypatch):
    import pyarrow.parquet as pq_

    from bulkinfer.outputs.index import IndexSpec, build_index

    config, bucket = s3job
    run_job(config(**{"model.options": {}}))
    for name, value in s3_server.env.items():  # the usual way a machine reaches its store
        monkeypatch.setenv(name, value)
    report = build_index(
        f"s3://{bucket}/out", tmp_path / "items.index", IndexSpec(kind="flat", metric="l2", queries=20)
    )
    assert (report.vectors, report.recall) == (250, 1.0)
    assert sorted(pq_.read_table(tmp_path / "items.index.ids.parquet")["id"].to_pylist()) == list(range(250))
    meta = json.loads((tmp_path / "items.index.json").read_text())
    assert meta["source"] == f"s3://{bucket}/out" and meta["job_fingerprint"]


PLAN_ONLY = """
import json, pathlib, sys
from bulkinfer import load_config
from bulkinfer.adapters import build_adapter, resolve_model
from bulkinfer.plan import JobPlan, make_plan

cfg = load_config(overrides={"source.paths": [sys.argv[1]], "model.name": "s3model:embed",
                             "model.feature_columns": ["x"], "source.id_column": "id", "source.shard_rows": 10000,
                             "sink.path": "unused"})
model = resolve_model(cfg)
stored = pathlib.Path("plan.json")  # as job.json holds it: the second run is a resume
existing = JobPlan.from_json(json.loads(stored.read_text())) if stored.exists() else None
plan = make_plan(cfg, model, build_adapter(cfg, model), existing)
stored.write_text(json.dumps(plan.to_json()))
print(json.dumps([[s.uri.rsplit("/", 1)[-1], s.start, s.stop] for s in plan.shards]))
"""


def test_planning_parquet_on_s3_costs_the_listing_and_one_read_per_small_file(s3job, s3_server, proxy, tmp_path):
    """Fingerprint, schema and row groups of a small Parquet file come from one ranged GET (its
    footer is in the bytes the fingerprint hashes); a big one costs two (head and tail); the
    sizes and versions come from the listing. A resume costs the listing alone (the ETags
    are the ones planned); a file replaced since is read again (and the run would refuse it).
    Counted at a proxy in front of the server."""
    _config, bucket = s3job
    client = s3_server.client()
    for i in range(12):
        t = pa.table({"id": np.arange(10 * i, 10 * i + 10), "x": np.arange(10)})
        buf = io.BytesIO()
        pq.write_table(t, buf)
        client.put_object(Bucket=bucket, Key=f"many/f{i:02d}.parquet", Body=buf.getvalue())
    big = pa.table({"id": np.arange(1000, 31000), "x": np.random.default_rng(0).normal(size=30000)})
    buf = io.BytesIO()
    pq.write_table(big, buf, row_group_size=10000, compression="none")
    assert len(buf.getvalue()) > 2 * 65536  # the footer is in the tail, apart from the head
    client.put_object(Bucket=bucket, Key="many/z-big.parquet", Body=buf.getvalue())
    (tmp_path / "plan_only.py").write_text(PLAN_ONLY)
    env = {**os.environ, **s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(tmp_path)}
    before = proxy.served
    proc = subprocess.run([sys.executable, "plan_only.py", f"s3://{bucket}/many/"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shards = json.loads(proc.stdout)
    assert shards[:12] == [[f"f{i:02d}.parquet", 0, 10] for i in range(12)]
    assert shards[12:] == [
        ["z-big.parquet", 0, 10000],
        ["z-big.parquet", 10000, 20000],
        ["z-big.parquet", 20000, 30000],
    ]
    requests = proxy.served - before
    # 12 + 2 reads, and the listing: is it a directory (a HEAD, a LIST) and the LIST of its objects
    assert 14 <= requests <= 14 + 3, requests

    def plan_again() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "plan_only.py", f"s3://{bucket}/many/"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)  # fmt: skip

    before = proxy.served
    again = plan_again()
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == shards
    assert proxy.served - before <= 3  # the listing only
    client.put_object(Bucket=bucket, Key="many/f03.parquet", Body=buf.getvalue())  # new content: a new ETag
    before = proxy.served
    changed = plan_again()
    assert proxy.served - before >= 1 + 3  # that one is read again
    assert json.loads(changed.stdout)[3] == ["f03.parquet", 0, 10000]  # planned anew (the store says so)


def test_inputs_on_a_store_the_environment_does_not_name_are_read_with_source_storage_options(s3job, s3_server,
                                                                                              tmp_path):  # fmt: skip
    """No AWS_* variables: the inputs' endpoint and credentials come from source.storage_options
    alone (as for a MinIO beside the cluster), the job reads and writes every row, and
    job.json keeps the endpoint but not the key or the secret."""
    _config, bucket = s3job
    s3_server.client().put_object(Bucket=bucket, Key="in/in.parquet", Body=(tmp_path / "in.parquet").read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # and no credentials from anywhere else botocore looks (files, an instance role)
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))  # fmt: skip
    opts = s3_server.options
    inline = (f'{{endpoint_url = "{opts["endpoint_url"]}", key = "{opts["key"]}", secret = "{opts["secret"]}", '
              'client_kwargs = {region_name = "us-east-1"}}')  # fmt: skip
    args = ["run", "-i", f"s3://{bucket}/in/", "-m", "s3model:embed", "--feature-columns", "x", "--id-column", "id",
            "-o", "out-opts", "--progress", "none", "--set", "source.shard_rows=50",
            "--set", f"source.storage_options={inline}"]  # fmt: skip
    proc = subprocess.run([*BULKINFER, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = pq.read_table(sorted((tmp_path / "out-opts").glob("part-*.parquet")))
    assert sorted(out["id"].to_pylist()) == list(range(250))
    stored = json.loads((tmp_path / "out-opts" / "_bulkinfer" / "job.json").read_text())["config"]["source"]
    assert stored["storage_options"]["endpoint_url"] == opts["endpoint_url"]
    assert stored["storage_options"]["key"] == stored["storage_options"]["secret"] == "<redacted>"
    # without them nothing names the store's endpoint or credentials: one line, no traceback
    proc = subprocess.run([*BULKINFER, *args[:-2], "-o", "out-none"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bulkinfer: error: s3://{bucket}/in/: cannot read it (NoCredentialsError: "), last
    assert last.endswith("check the path, and the store's endpoint and credentials (source.storage_options, or the "
                         "environment)")  # fmt: skip
    assert "Traceback" not in proc.stderr


def test_writers_racing_for_one_commit_record_exactly_one_wins(s3_server):
    """Eight runs commit the same row range at the same instant (a takeover gone wrong, a
    duplicated worker): the store's conditional create lets exactly one record exist."""
    from bulkinfer.commit.ledger import Commit
    from bulkinfer.commit.objledger import ObjectLedger
    from bulkinfer.core.errors import LedgerError
    from bulkinfer.sinks.objects import ObjectStore

    bucket = s3_server.bucket(f"b{uuid.uuid4().hex[:10]}")
    ledgers = [ObjectLedger(ObjectStore(f"s3://{bucket}/out", s3_server.options)) for _ in range(8)]
    record = [Commit(3, 0, 50, f"part-00003-{i}.parquet", 50, 100, f"{i:064d}") for i in range(8)]
    results = race(8, lambda i: ledgers[i].commit(record[i]))
    won = [i for i, r in enumerate(results) if isinstance(r, Commit)]
    assert len(won) == 1 and all(isinstance(r, LedgerError) for i, r in enumerate(results) if i != won[0])
    (kept,) = ledgers[0].commits()
    assert kept == record[won[0]]


def test_runs_racing_to_take_over_a_dead_runs_lease_exactly_one_wins(s3_server):
    """A lease nobody renewed (its run died on another machine); six runs start at once and
    each tries to take it over with If-Match on its ETag: one holds it, five are refused."""
    from bulkinfer.commit.objledger import LEASE_S, ObjectLedger
    from bulkinfer.sinks.objects import ObjectStore

    bucket = s3_server.bucket(f"b{uuid.uuid4().hex[:10]}")
    store = ObjectStore(f"s3://{bucket}/out", s3_server.options)
    dead = {"pid": 1, "host": "elsewhere", "run": "dead", "since": 0, "renewed": time.time() - 2 * LEASE_S}
    assert store.put_new("_bulkinfer/lock", json.dumps(dead).encode()) is not None
    ledgers = [ObjectLedger(ObjectStore(f"s3://{bucket}/out", s3_server.options)) for _ in range(6)]
    results = race(6, lambda i: ledgers[i].acquire())
    try:
        won = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
        assert len(won) == 1 and all(isinstance(r, LockedError) for i, r in enumerate(results) if i != won[0])
        held = json.loads(store.get("_bulkinfer/lock") or b"{}")
        assert held["run"] == ledgers[won[0]].run_id and ledgers[won[0]].took_over_from
    finally:
        for i, r in enumerate(results):
            if not isinstance(r, Exception):
                ledgers[i].release()


@pytest.mark.parametrize(
    "args",
    [
        [
            "run",
            "-i",
            "in.parquet",
            "-m",
            "s3model:embed",
            "--feature-columns",
            "x",
            "-o",
            "{out}",
            "--progress",
            "none",
        ],
        ["inspect", "{out}"],
        ["index", "{out}", "-o", "items.index"],
    ],
    ids=["run", "inspect", "index"],
)
def test_an_object_store_without_credentials_is_one_line_for_every_command(s3job, s3_server, args, tmp_path):
    """No credentials anywhere (no storage options, no AWS_* variables, no profile): the client
    raises its own error (botocore's NoCredentialsError, not an OSError); each command says it
    in one line naming the store and what to check, never a traceback."""
    _config, bucket = s3job
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_ENDPOINT_URL=s3_server.endpoint, PYTHONPATH=str(tmp_path))  # fmt: skip
    out = f"s3://{bucket}/out"
    proc = subprocess.run([*BULKINFER, *(a.format(out=out) for a in args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"bulkinfer: error: {out}") and "NoCredentialsError" in line and "credentials" in line


def test_a_resume_reads_the_commit_segments_not_every_record(s3job, s3_server, monkeypatch):
    """Every SEGMENT_RECORDS commits (here 2) a run writes the records it made into one segment;
    a reader GETs the segments and only the records no segment holds. A lost segment costs only
    the GETs of its records."""
    from bulkinfer.commit import objledger
    from bulkinfer.commit.objledger import ObjectLedger
    from bulkinfer.sinks.objects import ObjectStore

    monkeypatch.setattr(objledger, "SEGMENT_RECORDS", 2)
    config, bucket = s3job
    run_job(config())
    keys = s3_server.keys(bucket, "out/_bulkinfer/")
    segments = [k for k in keys if "/segments/" in k]
    assert len(segments) == 3  # 2 + 2 records while running, the last one when the run ended
    records = sorted(k.removeprefix("out/") for k in keys if "/commits/" in k)
    store = ObjectStore(f"s3://{bucket}/out", s3_server.options)
    fetched: list[str] = []
    get_many = store.get_many

    def counted(wanted):
        fetched.extend(wanted)
        return get_many(wanted)

    store.get_many = counted
    got = ObjectLedger(store).commits()
    assert [(c.shard, c.start, c.stop, c.rows) for c in got] == [(i, 50 * i, 50 * i + 50, 50) for i in range(5)]
    assert sorted(fetched) == sorted(k.removeprefix("out/") for k in segments)  # no record read alone
    s3_server.client().delete_object(Bucket=bucket, Key=segments[0])
    fetched.clear()
    again = ObjectLedger(store).commits()
    assert again == got
    alone = sorted(k for k in fetched if "/commits/" in k)
    assert len(alone) == 2 and set(alone) <= set(records)  # the lost segment's two records, one by one
