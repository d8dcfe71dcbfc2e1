"""Feast in and out, with Feast's local provider (a Parquet file offline store, a SQLite online
store) and a repo the test writes and applies with ``feast apply``: a batch job whose rows are
entity keys and times reads each row's features as of its time, and pushes its predictions into the
online store, each entity once across a SIGKILL."""

from __future__ import annotations

import datetime as dt
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from helpers import Server, cli, crash_then_rerun, read_output, write

pytest.importorskip("feast", reason="the feast extra (make install adds it)")

N = 240
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)  # the first values of every user's features
T1 = T0 + dt.timedelta(days=10)  # the second values

DEFINITIONS = """
from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource
from feast.types import Float64

user = Entity(name="user", join_keys=["user_id"])
stats = FeatureView(
    name="user_stats", entities=[user], ttl=timedelta(days=TTL_DAYS),
    schema=[Field(name="clicks_7d", dtype=Float64), Field(name="spend_30d", dtype=Float64),
            Field(name="visits", dtype=Float64)],
    source=FileSource(path="data/user_stats.parquet", timestamp_field="event_timestamp"),
)
predictions_push = PushSource(
    name="predictions_push",
    batch_source=FileSource(path="data/predictions.parquet", timestamp_field="event_timestamp"),
)
predictions = FeatureView(
    name="predictions", entities=[user], ttl=timedelta(days=365),
    schema=[Field(name="score", dtype=Float64)], source=predictions_push,
)
churn = FeatureService(name="churn", features=[stats])
"""

STORE = """project: shop
registry: data/registry.db
provider: local
online_store:
  type: sqlite
  path: data/online.db
offline_store:
  type: file
entity_key_serialization_version: 3
"""

MODEL = """
import numpy as np


def score(table):
    clicks, spend, visits = (np.asarray(table.column(c).to_pylist(), dtype=float) for c in ("clicks_7d", "spend_30d", "visits"))
    return {"score": clicks + 0.5 * spend - visits}
"""


def feature_values(user: np.ndarray, second: bool) -> dict[str, np.ndarray]:
    bump = 100.0 if second else 0.0
    return {"clicks_7d": user * 1.0 + bump, "spend_30d": user * 2.0 + bump, "visits": user % 7 + bump / 10}


def apply_repo(repo: Path, ttl_days: int = 30) -> None:
    (repo / "definitions.py").write_text(DEFINITIONS.replace("TTL_DAYS", str(ttl_days)))
    feast = Path(sys.executable).parent / "feast"
    subprocess.run([str(feast), "apply"], cwd=repo, check=True, capture_output=True, text=True)


@pytest.fixture
def shop(tmp_path, monkeypatch):
    """A Feast repo (two values of three features per user, at T0 and T1), an entity table whose rows
    ask for half the users before T1 and half after, and a scoring model; the job file."""
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(STORE)
    users = np.arange(N)
    frames = [pa.table({"user_id": users, "event_timestamp": pa.array([t] * N, pa.timestamp("us", "UTC")),
                        **feature_values(users, t == T1)}) for t in (T0, T1)]  # fmt: skip
    write(pa.concat_tables(frames), repo / "data" / "user_stats.parquet")
    write(pa.table({"user_id": [0], "event_timestamp": pa.array([T0], pa.timestamp("us", "UTC")), "score": [0.0]}),
          repo / "data" / "predictions.parquet")  # fmt: skip
    apply_repo(repo)
    asked = [T0 + dt.timedelta(days=1) if u % 2 else T1 + dt.timedelta(days=1) for u in users]
    write(pa.table({"user_id": users, "event_timestamp": pa.array(asked, pa.timestamp("us", "UTC"))}),
          tmp_path / "entities.parquet")  # fmt: skip
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "job.toml").write_text(
        '[source]\nkind = "feast"\nfeast_repo = "repo"\npaths = ["entities.parquet"]\nid_column = "user_id"\n'
        'features = ["user_stats:clicks_7d", "user_stats:spend_30d", "user_stats:visits"]\nshard_rows = 40\n'
        '[model]\nname = "model:score"\n[sink]\npath = "out"\n'
        '[[export]]\nkind = "feast"\nrepo = "repo"\npush_source = "predictions_push"\n'
    )
    return tmp_path


def expected_scores() -> dict[int, float]:
    users = np.arange(N)
    out = {}
    for second in (False, True):
        f = feature_values(users, second)
        score = f["clicks_7d"] + 0.5 * f["spend_30d"] - f["visits"]
        out.update({int(u): float(score[u]) for u in users if (u % 2 == 0) == second})
    return out


def online_scores(repo: Path) -> dict[int, float | None]:
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(repo))
    found = store.get_online_features(features=["predictions:score"], entity_rows=[{"user_id": int(u)} for u in range(N)])
    d = found.to_dict()
    return dict(zip(d["user_id"], d["score"], strict=True))


def test_each_row_gets_its_features_as_of_its_time_and_the_predictions_reach_the_online_store_once(shop):
    crash_then_rerun(shop, "export-feast-pushed:3")  # killed after the third part's push, before its ledger line
    out = read_output(shop / "out")
    assert set(out.column_names) - {"_input_hash"} == {"user_id", "event_timestamp", "score"}
    got = dict(zip(out.column("user_id").to_pylist(), out.column("score").to_pylist(), strict=True))
    want = expected_scores()
    assert got.keys() == want.keys() and all(got[u] == pytest.approx(want[u]) for u in want)
    assert online_scores(shop / "repo") == pytest.approx(want)
    with sqlite3.connect(shop / "repo" / "data" / "online.db") as db:
        (rows, keys), = db.execute("SELECT count(*), count(DISTINCT entity_key) FROM shop_predictions").fetchall()
    assert rows == keys == N  # one value per entity, however often a part was pushed


def test_the_predictions_reach_a_redis_online_store_once_across_a_sigkill(shop, redis_server):
    import uuid

    project = f"shop_{uuid.uuid4().hex[:8]}"  # the session's redis-server is shared: a project of its own
    store = STORE.replace("project: shop", f"project: {project}").replace(
        "  type: sqlite\n  path: data/online.db", f"  type: redis\n  connection_string: 127.0.0.1:{redis_server.port},db=0"
    )
    (shop / "repo" / "feature_store.yaml").write_text(store)
    apply_repo(shop / "repo")
    crash_then_rerun(shop, "export-feast-pushed:2")
    assert online_scores(shop / "repo") == pytest.approx(expected_scores())
    client = redis_server.client()
    keys = [k for k in client.scan_iter(count=1000) if project.encode() in k]
    assert len(keys) == N  # Feast's Redis store: one hash per entity, the predictions in it once


def test_serve_reads_the_same_features_online_and_skew_names_a_feature_changed_there(shop):
    import json

    import httpx
    from feast import FeatureStore

    with (shop / "job.toml").open("a") as job:  # in the job file: skew must still read offline as of now
        job.write("[serve]\nfeatures = true\n")
    cli("run", "job.toml", "--progress", "none", cwd=shop, check=True)
    store = FeatureStore(repo_path=str(shop / "repo"))
    store.materialize(T0 - dt.timedelta(days=1), T1 + dt.timedelta(days=1))  # the latest values online: T1's
    out = read_output(shop / "out")
    batch = dict(zip(out.column("user_id").to_pylist(), out.column("score").to_pylist(), strict=True))
    server = Server(["job.toml"], shop)
    try:  # the even users asked after T1: the batch job read T1's values, as the online store has them
        answer = httpx.post(f"{server.url}/v1/predict?features=true", json={"rows": [{"user_id": 2}, {"user_id": 4}]})
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    rows = answer.json()["rows"]
    assert [r["score"] for r in rows] == pytest.approx([batch[2], batch[4]])
    assert rows[0]["features"] == pytest.approx({"clicks_7d": 102.0, "spend_30d": 104.0, "visits": 12.0})
    clean = cli("skew", "out", "--json", "--sample", "50", cwd=shop)
    assert clean.returncode == 0, clean.stderr
    report = json.loads(clean.stdout)
    assert report["entities"] == 50 and report["worst_share"] == 0.0
    assert set(report["features"]) == {"clicks_7d", "spend_30d", "visits"} and set(report["outputs"]) == {"score"}
    store.write_to_online_store("user_stats", pd_frame(list(range(N))))  # every user's: no sample misses it
    skewed = cli("skew", "out", "--json", "--sample", "50", cwd=shop)
    assert skewed.returncode == 1, skewed.stderr
    report = json.loads(skewed.stdout)
    assert report["features"]["clicks_7d"] == {"differ": 50, "max_abs_difference": pytest.approx(5.0)}
    assert report["features"]["spend_30d"]["differ"] == report["features"]["visits"]["differ"] == 0
    assert report["outputs"]["score"]["differ"] == 50


def pd_frame(users: list[int]):
    """Every user's T1 values with clicks_7d 5 higher, stamped after T1 (the online store's latest)."""
    import pandas as pd

    u = np.asarray(users)
    values = feature_values(u, True)
    values["clicks_7d"] = values["clicks_7d"] + 5
    return pd.DataFrame({"user_id": u, "event_timestamp": [T1 + dt.timedelta(hours=1)] * len(u), **values})


def test_a_feature_service_names_the_features_instead_of_refs(shop):
    service = ["--set", "source.features=[]", "--set", 'source.feature_service="churn"']
    cli("run", "job.toml", "--progress", "none", *service, cwd=shop, check=True)
    out = read_output(shop / "out")
    got = dict(zip(out.column("user_id").to_pylist(), out.column("score").to_pylist(), strict=True))
    assert got == pytest.approx(expected_scores())
    both = cli("run", "job.toml", "--progress", "none", "--set", 'source.feature_service="churn"', "-o", "o2", cwd=shop)
    assert both.returncode == 1 and both.stderr.strip().splitlines()[-1].endswith(
        "source.feature_service: set it or source.features, not both"
    )
    unknown = cli("run", "job.toml", "--progress", "none", *service[:2], "--set", 'source.feature_service="chrun"',
                  "-o", "o3", cwd=shop)  # fmt: skip
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.strip().splitlines()[-1].endswith("Feast has no feature service 'chrun' (churn)")


@pytest.mark.parametrize("backend", ["ray", "spark"])
def test_a_feast_job_on_a_cluster_reads_the_same_features_in_its_workers(shop, backend):
    """Ray's and Spark's workers build their own readers from the job (the repo's path resolved
    where the driver ran): the scores equal the point-in-time ones, each entity once."""
    proc = cli("run", "job.toml", "--progress", "none", "--set", f"execution.backend='{backend}'",
               "--set", "execution.workers=2", cwd=shop)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = read_output(shop / "out")
    users = out.column("user_id").to_pylist()
    assert len(users) == len(set(users)) == N
    assert dict(zip(users, out.column("score").to_pylist(), strict=True)) == pytest.approx(expected_scores())


def test_a_changed_feature_view_is_another_job(shop):
    cli("run", "job.toml", "--progress", "none", cwd=shop, check=True)
    apply_repo(shop / "repo", ttl_days=60)
    proc = cli("run", "job.toml", "--progress", "none", cwd=shop)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "source.feast_definitions" in proc.stderr and "--overwrite" in proc.stderr


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("source.features", '["user_stats:clickz_7d"]',
         "source.features: 'user_stats:clickz_7d': feature view 'user_stats' has no feature 'clickz_7d'; "
         "did you mean user_stats:clicks_7d?"),
        ("source.features", '["users:clicks_7d"]',
         "source.features: 'users:clicks_7d': Feast has no feature view 'users' (predictions, user_stats)"),
        ("source.timestamp_column", '"asked_at"', "column 'asked_at' is not in"),
        ("source.feast_repo", '"model.py"', "source.feast_repo: model.py has no feature_store.yaml"),
        ("export", '[{kind = "feast", repo = "repo", push_source = "scores"}]',
         "export[0].push_source: the repo has no push source 'scores' (predictions_push)"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_before_any_row(shop, setting, value, message):
    proc = cli("run", "job.toml", "--progress", "none", "--set", f"{setting}={value}", cwd=shop)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1]
    assert not (shop / "out" / "_SUCCESS").exists()
    assert not list((shop / "out").glob("part-*"))
