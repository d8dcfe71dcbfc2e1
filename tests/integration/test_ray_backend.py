"""`execution.backend = "ray"` on a real local Ray instance (2 CPUs), started once for the module."""

from __future__ import annotations

import itertools
import json
import socket
import sys
import textwrap
import threading
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkinfer import run_job
from bulkinfer.adapters import build_adapter, resolve_model
from bulkinfer.commit.committer import Committer
from bulkinfer.commit.ledger import Ledger
from bulkinfer.core.errors import ConfigError
from bulkinfer.report import RunStats
from bulkinfer.sinks import make_sink
from bulkinfer.sources import list_inputs, plan_shards

from ensemble_job import check_on_a_cluster
from helpers import cli, fresh_module, job_config, make_catalog, read_output, tabular_table, train_classifier, write

ADAPTERS = textwrap.dedent("""
    import time
    import pyarrow.compute as pc

    def slow_on_flag(table):
        # rows flagged slow cost 10 ms each: their shard is the straggler
        time.sleep(0.01 * sum(table["slow"].to_pylist()))
        return {"y": pc.multiply(table["x"], 2)}
""")


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    name = fresh_module(tmp_path, monkeypatch, "raymodels", ADAPTERS)
    yield name
    sys.modules.pop(name, None)


_cfg = job_config


def _success(out):
    return json.loads((out / "_SUCCESS").read_text())


def test_ray_embeddings_equal_local(tmp_path, local_ray):
    write(make_catalog(300, seed=5), tmp_path / "in.parquet", row_group_size=100)
    common = {"model.name": "minilm", "model.text_column": "description", "source.shard_rows": 100}
    run_job(_cfg(tmp_path / "local", [tmp_path / "in.parquet"], **common))
    result = run_job(
        _cfg(
            tmp_path / "ray",
            [tmp_path / "in.parquet"],
            **common,
            **{"execution.backend": "ray", "execution.workers": 2},
        )
    )
    local, ray_out = read_output(tmp_path / "local").sort_by("id"), read_output(tmp_path / "ray").sort_by("id")
    assert ray_out["id"].to_pylist() == local["id"].to_pylist() == list(range(300))
    a = np.stack(local["embedding"].to_numpy(zero_copy_only=False))
    b = np.stack(ray_out["embedding"].to_numpy(zero_copy_only=False))
    assert np.abs(a - b).max() < 1e-5
    assert _success(tmp_path / "ray")["rows"] == _success(tmp_path / "local")["rows"] == 300
    assert sorted(f["name"] for f in _success(tmp_path / "ray")["files"]) == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    backend = result.report["backend"]
    assert backend["name"] == "ray" and backend["workers"] == 2
    assert result.report["rows_out"] == 300
    # where the time went: joining, the workers' start (model set-up included), how busy they were
    assert (
        0 <= backend["connect_s"] < result.report["wall_s"] and 0 < backend["workers_ready_s"] < result.report["wall_s"]
    )
    assert 0 < backend["worker_busy_share"] <= 1


def test_ray_sklearn_equals_local(tmp_path, local_ray):
    model = train_classifier(tmp_path / "model.joblib")
    t = tabular_table(900, seed=3)
    write(t, tmp_path / "in.parquet", row_group_size=150)
    common = {
        "model.name": str(model),
        "model.feature_columns": ["x1", "x2", "x3"],
        "source.shard_rows": 300,
        "sink.keep_columns": ["segment"],
    }
    run_job(_cfg(tmp_path / "local", [tmp_path / "in.parquet"], **common))
    ray_run = {"execution.backend": "ray"}
    run_job(_cfg(tmp_path / "ray", [tmp_path / "in.parquet"], **common, **ray_run))
    local = read_output(tmp_path / "local").sort_by("id")
    ray_out = read_output(tmp_path / "ray").sort_by("id")
    assert ray_out.num_rows == 900 and ray_out.column_names[-1] == "_input_hash"  # written by the workers
    assert ray_out.equals(local)
    assert _success(tmp_path / "ray")["rows"] == 900
    # the workers' column statistics, merged by the driver, are the local run's
    stats = {d: json.loads((tmp_path / d / "_bulkinfer" / "stats.json").read_text()) for d in ("local", "ray")}
    for d in stats.values():
        assert d["rows"] == 900 and set(d["columns"]) == {"prediction", "proba_no", "proba_yes"}
        labels = local["prediction"].to_pylist()
        assert d["columns"]["prediction"]["classes"] == {c: labels.count(c) for c in sorted(set(labels))}
    assert stats["ray"]["columns"]["proba_yes"]["mean"] == pytest.approx(stats["local"]["columns"]["proba_yes"]["mean"])
    for f in _success(tmp_path / "ray")["files"]:  # parts written by workers carry the driver's provenance
        p = json.loads(pq.read_metadata(tmp_path / "ray" / f["name"]).metadata[b"bulkinfer"])
        assert p["input_rows"] == [f["start"], f["stop"]] and p["model_kind"] == "tabular"
    # incremental on Ray: 90 changed rows reach the workers, the others come from the previous output
    x1 = t["x1"].to_numpy().copy()
    x1[::10] += 1.0
    write(t.set_column(1, "x1", [x1]), tmp_path / "changed.parquet", row_group_size=150)
    inc = run_job(_cfg(tmp_path / "inc", [tmp_path / "changed.parquet"], **common, **ray_run,
                       **{"source.previous": str(tmp_path / "ray")}))  # fmt: skip
    full = run_job(_cfg(tmp_path / "full", [tmp_path / "changed.parquet"], **common))
    assert inc.report["reuse"]["rows_from_previous"] == 810 and inc.report["reuse"]["rows_inferred"] == 90
    assert read_output(tmp_path / "inc").sort_by("id").equals(read_output(tmp_path / "full").sort_by("id"))
    assert full.report["rows_out"] == 900


def test_two_attempts_of_one_shard_commit_once(tmp_path, local_ray, user_module):
    """A worker presumed dead comes back and finishes the shard another worker redid."""
    t = pa.table({"id": np.arange(200), "x": np.arange(200), "slow": np.zeros(200, dtype=np.int64)})
    write(t, tmp_path / "in.parquet")
    out = tmp_path / "out"
    out.mkdir()
    cfg = _cfg(
        out,
        [tmp_path / "in.parquet"],
        **{
            "model.name": f"{user_module}:slow_on_flag",
            "model.feature_columns": ["x", "slow"],
            "execution.backend": "ray",
        },
    )
    shards = plan_shards(list_inputs(cfg.source.paths, "auto"), 1000)
    ledger = Ledger(out)
    ledger.acquire()
    stats = RunStats(rows_planned=200)
    committer = Committer(ledger, make_sink(cfg), stats, cfg, {s.index: s.start for s in shards}, failed_before=0)
    from bulkinfer.runners.ray import RayRunner

    runner = RayRunner(cfg, build_adapter(cfg, resolve_model(cfg)), stats, threading.Event())
    slots = [runner._start_worker() for _ in range(2)]
    assert [local_ray.get(s.ready)["error"] for s in slots] == [None, None]
    refs = [s.actor.process.remote([shards[0]], [None], f"attempt{i}", committer.stamp) for i, s in enumerate(slots)]
    answers = local_ray.get(refs)
    assert [(len(a["results"]), a["error"]) for a in answers] == [(1, None), (1, None)]
    assert len(list(out.glob(".part-00000.parquet.tmp-attempt*"))) == 2  # both staged, neither visible
    runner._accept(
        committer, [a["results"][0] for a in answers]
    )  # back together: one group, where only the first may commit
    assert runner.counts["discarded"] == 1
    assert [(c.shard, c.start, c.stop, c.rows) for c in ledger.commits()] == [(0, 0, 200, 200)]
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["part-00000.parquet"]
    assert read_output(out).sort_by("id")["y"].to_pylist() == [2 * i for i in range(200)]
    for s in slots:
        local_ray.kill(s.actor)
    ledger.release()


def test_straggler_shard_is_split_and_its_tail_runs_elsewhere(tmp_path, local_ray, user_module):
    slow = pa.table({"id": np.arange(600), "x": np.arange(600), "slow": np.ones(600, dtype=np.int64)})
    fast = pa.table({"id": np.arange(600, 640), "x": np.arange(600, 640), "slow": np.zeros(40, dtype=np.int64)})
    write(slow, tmp_path / "a.parquet")
    write(fast, tmp_path / "b.parquet")
    cfg = _cfg(
        tmp_path / "out",
        [tmp_path / "a.parquet", tmp_path / "b.parquet"],
        **{
            "model.name": f"{user_module}:slow_on_flag",
            "model.feature_columns": ["x", "slow"],
            "source.shard_rows": 1000,
            "runtime.batch_size": 10,
            "runtime.sort_window": 20,
            "runtime.prefetch_batches": 2,
            "execution.backend": "ray",
            "execution.workers": 2,
            "execution.split_min_rows": 50,
        },
    )
    result = run_job(cfg)
    assert result.report["backend"]["splits"] >= 1
    out = read_output(tmp_path / "out").sort_by("id")
    assert out["id"].to_pylist() == list(range(640))
    assert out["y"].to_pylist() == [2 * i for i in range(640)]
    stats = json.loads((tmp_path / "out" / "_bulkinfer" / "stats.json").read_text())
    assert stats["rows"] == 640 and stats["columns"]["y"]["mean"] == pytest.approx(out["y"].to_numpy().mean())
    names = [f["name"] for f in _success(tmp_path / "out")["files"]]
    assert "part-00000.parquet" in names
    assert any(n.startswith("part-00000_") for n in names)  # the tail, committed beside its head
    commits = sorted((c.start, c.stop) for c in Ledger(tmp_path / "out").commits() if c.shard == 0)
    assert commits[0][0] == 0 and commits[-1][1] == 600
    assert all(a[1] == b[0] for a, b in itertools.pairwise(commits))  # contiguous, no overlap


def test_worker_that_fits_no_node_is_a_clear_error(tmp_path, local_ray, user_module):
    t = pa.table({"id": np.arange(10), "x": np.arange(10), "slow": np.zeros(10, dtype=np.int64)})
    write(t, tmp_path / "in.parquet")
    cfg = _cfg(
        tmp_path / "out",
        [tmp_path / "in.parquet"],
        **{
            "model.name": f"{user_module}:slow_on_flag",
            "model.feature_columns": ["x", "slow"],
            "execution.backend": "ray",
            "execution.num_cpus": 3,
        },
    )
    with pytest.raises(ConfigError, match=r"num_cpus=3.*no node of the Ray cluster fits one worker.*2 CPUs"):
        run_job(cfg)


def test_more_workers_than_fit_starts_as_many_as_fit_with_a_warning(tmp_path, local_ray, user_module, caplog):
    t = pa.table({"id": np.arange(300), "x": np.arange(300), "slow": np.zeros(300, dtype=np.int64)})
    write(t, tmp_path / "in.parquet", row_group_size=50)
    cfg = _cfg(tmp_path / "out", [tmp_path / "in.parquet"], **{
        "model.name": f"{user_module}:slow_on_flag", "model.feature_columns": ["x", "slow"],
        "source.shard_rows": 50, "execution.backend": "ray", "execution.workers": 5,
    })  # fmt: skip
    with caplog.at_level("WARNING", logger="bulkinfer"):
        result = run_job(cfg)
    assert "execution.workers=5 but the Ray cluster fits 2; starting 2" in caplog.text
    assert result.report["backend"]["workers_started"] == 2
    assert sorted(read_output(tmp_path / "out")["y"].to_pylist()) == [2 * i for i in range(300)]


def test_unreachable_cluster_address_is_one_line(tmp_path):
    write(make_catalog(10), tmp_path / "in.parquet")
    proc = cli(
        "run", "-i", "in.parquet", "-m", "minilm", "--text-column", "description", "-o", "out",
        "--backend", "ray", "--ray-address", "127.0.0.1:1", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "bulkinfer: error: execution.ray_address '127.0.0.1:1': nothing answers there (Connection refused); "
        "start the cluster (ray start --head) or fix the address"
    ]


def test_ray_results_reach_export_targets_from_the_driver(tmp_path, local_ray, user_module, redis_server):
    t = pa.table({"id": np.arange(300), "x": np.arange(300), "slow": np.zeros(300, dtype=np.int64)})
    write(t, tmp_path / "in.parquet")
    prefix = f"ray{uuid.uuid4().hex[:6]}:"
    cfg = _cfg(
        tmp_path / "out",
        [tmp_path / "in.parquet"],
        **{
            "model.name": f"{user_module}:slow_on_flag",
            "model.feature_columns": ["x", "slow"],
            "source.shard_rows": 100,
            "execution.backend": "ray",
            "export": [{"kind": "redis", "url": redis_server.url, "key": prefix + "{id}"}],
        },
    )
    result = run_job(cfg)
    r = redis_server.client()
    version = r.get(prefix + "current").decode()
    assert {int(r.get(f"{prefix}{version}:{i}")) for i in range(300)} == {2 * i for i in range(300)}
    assert next(iter(result.report["exports"].values()))["rows"] == 300


def test_ray_workers_write_to_an_object_store(tmp_path, local_ray, user_module, s3_server):
    """Workers stage their parts in the bucket themselves; the driver commits and copies them into
    place. Rows with y >= 600 are routed to a folder instead (split on the workers, written by the driver)."""
    t = pa.table({"id": np.arange(400), "x": np.arange(400, dtype=np.int64), "slow": np.zeros(400, dtype=np.int64)})
    write(t, tmp_path / "in.parquet", row_group_size=100)
    bucket = s3_server.bucket(f"ray{uuid.uuid4().hex[:10]}")
    extra = {"model.name": f"{user_module}:slow_on_flag", "model.feature_columns": ["x", "slow"],
             "source.shard_rows": 100, "execution.backend": "ray", "execution.workers": 2,
             "sink.storage_options": s3_server.options,
             "route": [{"name": "big", "when": "y >= 600", "export": [{"kind": "folder", "path": str(tmp_path / "big")}]}]}  # fmt: skip
    result = run_job(_cfg(f"s3://{bucket}/out", [tmp_path / "in.parquet"], **extra))
    assert result.report["backend"]["name"] == "ray" and result.report["rows_out"] == 400
    assert result.report["routes"] == {"default": 300, "big": 100}
    big = read_output(tmp_path / "big")
    assert sorted(big["id"].to_pylist()) == list(range(300, 400))
    keys = s3_server.keys(bucket, "out/")
    parts = [k for k in keys if k.startswith("out/part-")]
    assert parts == [f"out/part-{i:05d}.parquet" for i in range(3)]  # shard 3 went to the route whole
    assert not [k for k in keys if "_temporary" in k]
    got = pa.concat_tables([pq.read_table(pa.BufferReader(s3_server.get(bucket, k))) for k in parts])
    assert sorted(got["id"].to_pylist()) == list(range(300))
    assert got.sort_by("id")["y"].to_pylist() == [2 * i for i in range(300)]


def test_a_knn_job_on_ray_equals_the_local_one(tmp_path, local_ray, user_module):
    """The index is the model: each worker loads it once (in setup) and answers its shards."""
    from bulkinfer.outputs.index import IndexSpec, build_index

    rng = np.random.default_rng(4)
    v = rng.normal(size=(600, 16)).astype(np.float32)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 16)
    (tmp_path / f"{user_module}_pass.py").write_text("def embed(t):\n    return {'embedding': t['v']}\n")
    write(pa.table({"id": np.arange(600), "v": vec}), tmp_path / "items.parquet")
    run_job(_cfg(tmp_path / "items", [tmp_path / "items.parquet"],
                 **{"model.name": f"{user_module}_pass:embed", "model.feature_columns": ["v"]}))  # fmt: skip
    build_index(tmp_path / "items", tmp_path / "items.index", IndexSpec(kind="flat", queries=20))
    write(pa.table({"id": np.arange(0, 600, 3), "v": vec.take(pa.array(np.arange(0, 600, 3)))}), tmp_path / "q.parquet")
    common = {"model.name": str(tmp_path / "items.index"), "model.feature_columns": ["v"],
              "model.options": {"k": 7}, "source.shard_rows": 50}  # fmt: skip
    run_job(_cfg(tmp_path / "local", [tmp_path / "q.parquet"], **common))
    result = run_job(_cfg(tmp_path / "ray", [tmp_path / "q.parquet"], **common,
                          **{"execution.backend": "ray", "execution.workers": 2}))  # fmt: skip
    assert result.report["backend"]["name"] == "ray" and result.report["rows_out"] == 200
    local, on_ray = read_output(tmp_path / "local").sort_by("id"), read_output(tmp_path / "ray").sort_by("id")
    assert on_ray["neighbors"].to_pylist() == local["neighbors"].to_pylist()
    assert all(
        len(n) == 7 and i not in n for i, n in zip(local["id"].to_pylist(), local["neighbors"].to_pylist(), strict=True)
    )


STALLING = textwrap.dedent("""
    import os
    import time
    import pyarrow.compute as pc

    def stall_on_flag(table):
        # a flagged shard names its worker's pid in PIDS, then works for a second: long enough
        # for the test to freeze that process (SIGSTOP) mid-shard
        if sum(table["stall"].to_pylist()):
            open(os.path.join(PIDS, str(os.getpid())), "w").close()
            time.sleep(1.0)
        time.sleep(0.005 * table.num_rows)
        return {"y": pc.multiply(table["x"], 2)}
""")


def test_a_stalled_worker_is_presumed_dead_its_shard_redone_and_its_late_result_discarded(tmp_path, local_ray):
    """A worker frozen mid-shard (SIGSTOP: a paused VM, a call stuck holding the GIL) answers no
    heartbeat: after worker_timeout_s its shard goes to the other worker, which commits it; the
    frozen one is then thawed, finishes the same rows late, and that result is discarded."""
    import os
    import signal
    import time

    from bulkinfer.commit.ledger import Ledger

    pids = tmp_path / "pids"
    pids.mkdir()
    name = f"stall_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(f"PIDS = {str(pids)!r}\n" + STALLING)
    sys.path.insert(0, str(tmp_path))
    rows = 1200
    stall = np.zeros(rows, dtype=np.int64)
    stall[0] = 1  # shard 0 stalls
    write(
        pa.table({"id": np.arange(rows), "x": np.arange(rows), "stall": stall}),
        tmp_path / "in.parquet",
        row_group_size=40,
    )
    out = tmp_path / "out"
    # worker_timeout_s 5: a live worker on a busy 2-core box (another test loading a model) has missed 2 s
    cfg = _cfg(out, [tmp_path / "in.parquet"], **{
        "model.name": f"{name}:stall_on_flag", "model.feature_columns": ["x", "stall"],
        "source.shard_rows": 40, "execution.backend": "ray", "execution.workers": 2,
        "execution.worker_timeout_s": 5.0, "execution.split_min_rows": 0,
    })  # fmt: skip
    result: dict = {}
    job = threading.Thread(target=lambda: result.setdefault("r", run_job(cfg)))
    job.start()
    try:
        deadline = time.monotonic() + 120
        while not list(pids.iterdir()):
            assert time.monotonic() < deadline and job.is_alive(), "shard 0 never started"
            time.sleep(0.01)
        frozen = int(next(pids.iterdir()).name)
        os.kill(frozen, signal.SIGSTOP)
        try:
            while not any(c.shard == 0 for c in Ledger(out).commits()):  # the other worker redid it
                assert time.monotonic() < deadline and job.is_alive(), "shard 0 was never redone"
                time.sleep(0.02)
            assert sorted(int(p.name) for p in pids.iterdir()) != [frozen]  # redone by another process
        finally:
            os.kill(frozen, signal.SIGCONT)
        job.join(timeout=120)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
    backend = result["r"].report["backend"]
    assert (backend["requeued"], backend["discarded"], backend["workers_lost"]) == (1, 1, 0)
    assert [(c.start, c.stop) for c in Ledger(out).commits() if c.shard == 0] == [(0, 40)]  # committed once
    table = read_output(out).sort_by("id")
    assert table["id"].to_pylist() == list(range(rows))
    assert table["y"].to_pylist() == [2 * i for i in range(rows)]


def test_a_driver_without_the_jobs_device_runs_the_gate_on_a_worker(tmp_path, tiny, local_ray, monkeypatch,
                                                                     caplog):  # fmt: skip
    """A GPU job's driver often runs on a CPU head node: the gate (which needs the model on the
    job's device) then runs on a worker started for it, and its figures, or its refusal, come
    back to the driver. Forced here on CPUs (int8, a tiny random BERT): the driver is told it
    lacks the device and cannot set the model up at all."""
    import logging

    from bulkinfer import QualityGateError
    from bulkinfer.adapters.text import TextEmbeddingAdapter
    from bulkinfer.runners.ray import RayRunner

    model = tiny
    write(make_catalog(120, seed=4), tmp_path / "in.parquet")

    def run(out, **extra):
        return run_job(_cfg(tmp_path / out, [tmp_path / "in.parquet"], **{
            "model.name": str(model), "model.text_column": "description", "runtime.precision": "int8",
            "runtime.cache_dir": str(tmp_path / "cache"), "runtime.quality_sample_rows": 48, **extra}))  # fmt: skip

    caplog.set_level(logging.INFO, logger="bulkinfer")
    here = run("gate-here", **{"runtime.quality_floor": -1.0}).report["quality"]

    def no_model_here(self, ctx):
        raise AssertionError("the driver set the model up")

    monkeypatch.setattr(RayRunner, "_device_here", lambda self: False)
    monkeypatch.setattr(TextEmbeddingAdapter, "setup", no_model_here)
    on_ray = {"execution.backend": "ray", "execution.workers": 1, "execution.num_cpus": 1}
    result = run("gate-worker", **{"runtime.quality_floor": -1.0}, **on_ray)
    got = result.report["quality"]
    assert got["passed"] and got["rows"] == here["rows"] == 48
    for key in ("mean_cosine", "min_cosine", "top10_overlap"):
        assert got[key] == pytest.approx(here[key], abs=1e-5)
    assert json.loads((tmp_path / "gate-worker" / "_bulkinfer" / "quality.json").read_text()) == got
    assert result.report["rows_out"] == 120 and result.report["backend"]["workers_started"] == 1
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("quality gate (on a worker")]
    assert said == [f"quality gate (on a worker, int8 vs fp32): rows=48, floor=-1.0, mean_cosine={got['mean_cosine']}, "
                    f"min_cosine={got['min_cosine']}, top10_overlap={got['top10_overlap']}, passed=True"]  # fmt: skip
    # a refusal on the worker is the driver's one-line error, with the figures, and nothing is written
    with pytest.raises(QualityGateError) as refused:
        run("refused-worker", **on_ray, **{"runtime.quality_floor": 0.99999, "runtime.int8_fp32_groups": []})
    assert str(refused.value).startswith("quality gate: int8 is too far from fp32 on 48 rows of this job")
    assert refused.value.figures["mean_cosine"] == pytest.approx(here["mean_cosine"], abs=1e-5)
    assert not list((tmp_path / "refused-worker").glob("part-*"))


def test_precision_auto_on_a_driver_without_the_jobs_device_is_chosen_on_a_worker(tmp_path, tiny, local_ray,
                                                                                   monkeypatch, caplog):  # fmt: skip
    """precision = auto on a GPU job's CPU-only driver: a worker, which has the device, reads the
    tune results of its machine kind or calibrates once and keeps them in its cache; the driver
    measures nothing and runs what the worker chose. Forced here on CPUs: the driver is told it
    lacks the device, and a measurement or a model set up on it fails the test."""
    import logging

    from bulkinfer.adapters.text import TextEmbeddingAdapter
    from bulkinfer.core import hardware
    from bulkinfer.precision import tune

    model = tiny
    write(make_catalog(200, seed=5), tmp_path / "in.parquet")

    def nothing_here(*args, **kwargs):
        raise AssertionError("the driver measured or set the model up")

    monkeypatch.setattr(hardware, "device_here", lambda device: False)
    monkeypatch.setattr(tune, "tune", nothing_here)
    monkeypatch.setattr(TextEmbeddingAdapter, "setup", nothing_here)
    caplog.set_level(logging.INFO, logger="bulkinfer")

    def run(out, cpus=1):
        caplog.clear()
        result = run_job(_cfg(tmp_path / out, [tmp_path / "in.parquet"], **{
            "model.name": str(model), "model.text_column": "description", "runtime.precision": "auto",
            "runtime.engine": "onnxruntime", "runtime.cache_dir": str(tmp_path / "cache"), "runtime.quality_sample_rows": 48,
            "execution.backend": "ray", "execution.workers": 1, "execution.num_cpus": cpus}))  # fmt: skip
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("runtime.precision = auto: ")]
        return result.report, said

    first, said = run("first")
    (kept,) = (tmp_path / "cache" / "tune").glob("*.json")
    measured = json.loads(kept.read_text())["candidates"]
    usable = [c for c in measured if c["passed"] and c.get("rows_per_s")]
    best = max(usable, key=lambda c: c["rows_per_s"])
    assert (first["engine"], first["precision"]) == (best["engine"], best["precision"])
    assert first["rows_out"] == 200 and first["backend"]["workers_started"] == 1
    assert said[0].startswith("runtime.precision = auto: runtime.device = cpu and this driver has no GPU")
    assert said[1].startswith(f"runtime.precision = auto: {best['precision']} on {best['engine']} (")
    assert "calibrated now on 128 rows" in said[1] and said[1].endswith(f"; on a worker, {socket.gethostname()})")
    # the next job reads what the worker kept: no calibration again
    stamp = kept.stat().st_mtime_ns
    second, said = run("second")
    assert (second["engine"], second["precision"]) == (first["engine"], first["precision"])
    assert f"measured by bulkinfer tune, {kept}" in said[1] and kept.stat().st_mtime_ns == stamp
    # a worker no node fits is one line before anything is asked of the cluster (not a task that waits for ever)
    with pytest.raises(ConfigError, match=r"execution.num_cpus=64, num_gpus=0: no node of the Ray cluster fits one"):
        run("too-big", cpus=64)
    assert not (tmp_path / "too-big").exists()


def test_fast_shards_go_several_to_a_call_and_each_commits_once(tmp_path, local_ray, user_module):
    """300 one-row shards that take no model time: after the first calls (one shard each, nothing
    measured yet) the driver hands each worker several per call; every shard is committed once,
    with its own part, and the workers' figures are counted once."""
    t = pa.table({"id": np.arange(300), "x": np.arange(300), "slow": np.zeros(300, dtype=np.int64)})
    write(t, tmp_path / "in.parquet")
    cfg = _cfg(tmp_path / "out", [tmp_path / "in.parquet"], **{
        "model.name": f"{user_module}:slow_on_flag", "model.feature_columns": ["x", "slow"],
        "source.shard_rows": 1, "execution.backend": "ray", "execution.workers": 2})  # fmt: skip
    result = run_job(cfg)
    backend = result.report["backend"]
    assert backend["calls"] <= 100  # 300 shards in at most a third as many calls
    commits = Ledger(tmp_path / "out").commits()
    assert sorted((c.start, c.stop) for c in commits) == [(i, i + 1) for i in range(300)]
    assert len(_success(tmp_path / "out")["files"]) == 300
    assert read_output(tmp_path / "out").sort_by("id")["y"].to_pylist() == [2 * i for i in range(300)]
    assert result.report["rows_out"] == 300 and result.report["reuse"]["rows_inferred"] == 300


def test_pictures_on_ray_equal_local(tmp_path, local_ray):
    from pictures import write_bad, write_photos

    names = write_photos(tmp_path / "photos", 6, scale=0.5)
    write_bad(tmp_path / "photos")
    common = {"model.name": "nudenet", "source.format": "images", "source.shard_rows": 2, "execution.max_errors": 3}
    local = run_job(_cfg(tmp_path / "local", [tmp_path / "photos"], **common))
    on_ray = run_job(_cfg(tmp_path / "ray", [tmp_path / "photos"], **common, **{"execution.backend": "ray"}))
    assert local.status == on_ray.status == "complete"
    rows = read_output(tmp_path / "ray").sort_by("id")
    assert rows.column("id").to_pylist() == sorted(names)
    assert (
        rows.column("detections").to_pylist() == read_output(tmp_path / "local").sort_by("id")["detections"].to_pylist()
    )
    assert on_ray.report["rows_failed"] == 3


def test_several_models_on_ray_equal_local_with_each_models_figures(tmp_path, local_ray, monkeypatch):
    """[models] on Ray: the workers run the models in their order, the failures stay per model,
    the routes act on the decision, and each model's figures reach the driver's report."""
    check_on_a_cluster(tmp_path, monkeypatch, "ray")
