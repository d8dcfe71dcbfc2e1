"""`execution.backend = "spark"` on a real local Spark (a local[2,3] master: two task slots, three
attempts per task), started once for the module; the jobs run on it as a user's own PySpark
application would run them."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer import ConfigError, run_job

from ensemble_job import check_on_a_cluster
from helpers import fresh_module, job_config, make_catalog, read_output, tabular_table, train_classifier, write

MODELS = textwrap.dedent("""
    import os, signal
    import pyarrow.compute as pc

    MARKER = {marker!r}

    def double(table):
        return {{"y": pc.multiply(table["x"], 2)}}

    def crash_once(table):
        # the first task to see row 150 kills its own Python worker (a segfault, an OOM kill)
        if 150 in table["x"].to_pylist() and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {{"y": pc.multiply(table["x"], 2)}}

    def fails_on_13(table):
        if 13 in table["x"].to_pylist():
            raise ValueError("row 13 is bad")
        return {{"y": pc.multiply(table["x"], 2)}}
""")


@pytest.fixture(scope="module")
def spark():
    from bulkinfer.spark.session import spark_session

    session, started = spark_session("local[2,3]", {})
    assert started and session.sparkContext.defaultParallelism == 2
    yield session
    session.stop()


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    name = fresh_module(tmp_path, monkeypatch, "sparkmodels", MODELS.format(marker=str(tmp_path / "crashed")))
    yield name
    sys.modules.pop(name, None)


_cfg = job_config


def _counts(tmp_path, n):
    t = pa.table({"id": np.arange(n), "x": np.arange(n)})
    write(t, tmp_path / "in.parquet", row_group_size=50)
    return tmp_path / "in.parquet"


def test_spark_embeddings_equal_local(tmp_path, spark):
    write(make_catalog(120, seed=5), tmp_path / "in.parquet", row_group_size=40)
    common = {"model.name": "minilm", "model.text_column": "description", "source.shard_rows": 40}
    run_job(_cfg(tmp_path / "local", [tmp_path / "in.parquet"], **common))
    result = run_job(_cfg(tmp_path / "spark", [tmp_path / "in.parquet"], **common, **{"execution.backend": "spark"}))
    local = read_output(tmp_path / "local").sort_by("id")
    got = read_output(tmp_path / "spark").sort_by("id")
    assert got["id"].to_pylist() == local["id"].to_pylist() == list(range(120))
    a = np.stack(local["embedding"].to_numpy(zero_copy_only=False))
    b = np.stack(got["embedding"].to_numpy(zero_copy_only=False))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.9999
    backend = result.report["backend"]
    assert backend["name"] == "spark" and backend["master"] == "local[2,3]"
    assert backend["tasks"] == 3 and backend["slots"] == 2 and backend["task_retries"] == 0
    assert json.loads((tmp_path / "spark" / "_SUCCESS").read_text())["rows"] == 120


def test_spark_tabular_equals_local_with_exports_and_routes(tmp_path, spark, redis_server):
    model = train_classifier(tmp_path / "model.joblib")
    write(tabular_table(900, seed=3), tmp_path / "in.parquet", row_group_size=150)
    prefix = f"spark{uuid.uuid4().hex[:6]}:"
    common = {
        "model.name": str(model),
        "model.feature_columns": ["x1", "x2", "x3"],
        "source.shard_rows": 300,
        "sink.keep_columns": ["segment"],
    }
    run_job(_cfg(tmp_path / "local", [tmp_path / "in.parquet"], **common))
    spark_run = {
        "execution.backend": "spark",
        "export": [{"kind": "redis", "url": redis_server.url, "key": prefix + "{id}", "columns": ["prediction"]}],
        "route": [
            {"name": "sure", "when": "proba_yes >= 0.9", "export": [{"kind": "folder", "path": str(tmp_path / "sure")}]}
        ],
    }
    result = run_job(_cfg(tmp_path / "spark", [tmp_path / "in.parquet"], **common, **spark_run))
    local = read_output(tmp_path / "local").sort_by("id")
    sure = local.filter(pa.compute.greater_equal(local["proba_yes"], 0.9))
    rest = local.filter(pa.compute.less(local["proba_yes"], 0.9))
    assert 0 < sure.num_rows < 900
    assert read_output(tmp_path / "spark").sort_by("id").equals(rest)
    assert read_output(tmp_path / "sure").sort_by("id").equals(sure)
    assert result.report["routes"] == {"default": rest.num_rows, "sure": sure.num_rows}
    r = redis_server.client()
    version = r.get(prefix + "current").decode()
    got = {i: r.get(f"{prefix}{version}:{i}").decode() for i in rest["id"].to_pylist()}  # one column: its value
    assert got == dict(zip(rest["id"].to_pylist(), rest["prediction"].to_pylist(), strict=True))


def test_a_task_whose_worker_dies_is_retried_and_its_rows_committed_once(tmp_path, spark, user_module):
    cfg = _cfg(
        tmp_path / "out",
        [_counts(tmp_path, 400)],
        **{
            "model.name": f"{user_module}:crash_once",
            "model.feature_columns": ["x"],
            "source.shard_rows": 100,
            "execution.backend": "spark",
        },
    )
    result = run_job(cfg)
    assert (tmp_path / "crashed").exists()  # the worker did die
    out = read_output(tmp_path / "out")
    assert sorted(out["id"].to_pylist()) == list(range(400))
    assert dict(zip(out["id"].to_pylist(), out["y"].to_pylist(), strict=True)) == {i: 2 * i for i in range(400)}
    assert result.report["backend"]["task_retries"] == 1 and result.report["backend"]["tasks"] == 4
    assert not list((tmp_path / "out").glob(".part-*"))  # the dead attempt's temporary files were swept


def test_bad_rows_fail_alone_in_a_spark_task(tmp_path, spark, user_module):
    cfg = _cfg(
        tmp_path / "out",
        [_counts(tmp_path, 200)],
        **{"model.name": f"{user_module}:fails_on_13", "model.feature_columns": ["x"], "source.shard_rows": 100,
           "execution.backend": "spark"},
    )  # fmt: skip
    result = run_job(cfg)
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == [i for i in range(200) if i != 13]
    errors = [json.loads(line) for f in (tmp_path / "out" / "_errors").glob("*.jsonl") for line in f.open()]
    assert [e["id"] for e in errors] == [13] and errors[0]["error_type"] == "ValueError"
    assert errors[0]["message"] == "row 13 is bad"
    assert result.report["rows_failed"] == 1


def test_spark_settings_that_cannot_hold_are_refused(tmp_path, spark, user_module):
    common = {"model.name": f"{user_module}:double", "model.feature_columns": ["x"], "execution.backend": "spark"}
    path = _counts(tmp_path, 10)
    cases = {
        "execution.spark_master": ("spark://elsewhere:7077", "already runs a Spark session on 'local[2,3]'"),
        "execution.num_cpus": (1.5, "Spark tasks take whole CPUs"),
        "execution.ray_address": ("auto", "the Ray backend's"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            run_job(_cfg(tmp_path / key, [path], **common, **{key: value}))
    with pytest.raises(ConfigError, match="gives each task 1"):
        run_job(_cfg(tmp_path / "cpus", [path], **common, **{"execution.num_cpus": 2}))


def test_fast_shards_go_several_to_a_task_and_each_commits_once(tmp_path, spark, user_module):
    """200 one-row shards that take no model time: a Spark job's scheduling (tens of ms) would be
    most of each; after the first tasks the driver hands each task several shards."""
    cfg = _cfg(tmp_path / "out", [_counts(tmp_path, 200)], **{
        "model.name": f"{user_module}:double", "model.feature_columns": ["x"], "source.shard_rows": 1,
        "execution.backend": "spark"})  # fmt: skip
    result = run_job(cfg)
    backend = result.report["backend"]
    assert backend["shards"] == 200 and backend["tasks"] <= 50
    got = read_output(tmp_path / "out").sort_by("id")
    assert got["id"].to_pylist() == list(range(200)) and got["y"].to_pylist() == [2 * i for i in range(200)]
    assert len(json.loads((tmp_path / "out" / "_SUCCESS").read_text())["files"]) == 200
    assert result.report["rows_out"] == 200 and result.report["reuse"]["rows_inferred"] == 200


def test_video_frames_on_spark_equal_local(tmp_path, spark):
    from pictures import write_video

    write_video(tmp_path / "clips" / "a.mkv", 4.0)
    write_video(tmp_path / "clips" / "b.mkv", 3.0)
    common = {"model.name": "nudenet", "source.format": "video", "source.shard_rows": 3, "source.video": {"fps": 2}}
    local = run_job(_cfg(tmp_path / "local", [tmp_path / "clips"], **common))
    on_spark = run_job(_cfg(tmp_path / "spark", [tmp_path / "clips"], **common, **{"execution.backend": "spark"}))
    assert local.status == on_spark.status == "complete"
    ours = read_output(tmp_path / "spark").sort_by("id").to_pylist()
    assert [(r["id"], r["timestamp_s"]) for r in ours] == [
        (r["id"], r["timestamp_s"]) for r in read_output(tmp_path / "local").sort_by("id").to_pylist()
    ]
    assert len(ours) == 14
    assert (tmp_path / "spark" / "_videos.parquet").exists()


def test_several_models_on_spark_equal_local_with_each_models_figures(tmp_path, spark, monkeypatch):
    """[models] on Spark: each task runs the models in their order, the failures stay per model,
    the routes act on the decision, and each model's figures reach the driver's report."""
    check_on_a_cluster(tmp_path, monkeypatch, "spark")
