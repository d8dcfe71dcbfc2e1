from __future__ import annotations

import json

from bulkinfer import load_config
from bulkinfer.adapters import resolve_model
from bulkinfer.core.hardware import available_cpus
from bulkinfer.precision.tune import results_path

from helpers import cli, make_catalog, read_output, write


def test_tune_picks_a_gate_passing_candidate_and_writes_a_runnable_job(tmp_path):
    write(make_catalog(120, seed=4), tmp_path / "data" / "c.parquet")
    (tmp_path / "job.toml").write_text(
        '[source]\npaths = ["data/c.parquet"]\nid_column = "id"\n[model]\nname = "minilm"\n'
        'text_column = "description"\n[runtime]\nquality_floor = 0.9999\n[sink]\npath = "out"\n'
    )
    # bf16 is left out: emulated on CPUs without bf16 instructions, it is slow and never chosen there
    pairs = "onnxruntime/fp32,onnxruntime/int8,torch/fp32"
    # no int8 search: at this floor it would build int8 with more and more blocks in fp32 and refuse
    # (tests/integration/test_int8_partial.py runs the search, on a tiny model)
    proc = cli("tune", "job.toml", "--sample-rows", "48", "--batch-sizes", "8,12", "--candidates", pairs,
               "--no-int8-search", cwd=tmp_path, check=True)  # fmt: skip
    assert "wrote job.tuned.toml" in proc.stdout
    table = proc.stderr
    assert "<- chosen" in table and "FAIL" in table  # int8 cannot meet a 0.9999 floor
    # each candidate once (in the table), its engine named whole
    rows = [line for line in table.splitlines() if "│ torch " in line or "│ onnxruntime " in line]
    assert len(rows) == 6 and "…" not in table and "onnxrunti " not in table
    assert sum("torch" in line for line in table.splitlines()) == 2  # torch fp32 at batch 8 and 12, nothing else
    # the tuned job holds the job's own settings and what tune chose, nothing left at its default
    text = (tmp_path / "job.tuned.toml").read_text()
    assert len(text.splitlines()) < 25 and "[cost]" not in text and "[serve]" not in text
    tuned = load_config(tmp_path / "job.tuned.toml")
    assert set(tuned.runtime.model_fields_set) <= {"quality_floor", "engine", "precision", "batch_size", "threads"}
    assert (tuned.runtime.engine, tuned.runtime.precision) != ("onnxruntime", "int8")
    assert tuned.runtime.batch_size in (8, 12) and tuned.model.text_column == "description"
    chosen = proc.stdout.split("chosen: ")[1]
    assert chosen.startswith(f"{tuned.runtime.engine} {tuned.runtime.precision}, batch {tuned.runtime.batch_size}")
    cli("run", "job.tuned.toml", "--progress", "none", cwd=tmp_path, check=True)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(120))

    # batch_size = "auto" takes the fastest size tune measured for the job's engine and precision
    cfg = load_config(tmp_path / "job.toml")
    measured = json.loads(results_path(cfg, resolve_model(cfg).digest).read_text())["candidates"]
    # the chosen one is the fastest of those that passed the gate; those that failed were below the floor
    passing = [c for c in measured if c["passed"] and c["rows_per_s"]]
    fastest = max(passing, key=lambda c: c["rows_per_s"])
    assert (tuned.runtime.engine, tuned.runtime.precision, tuned.runtime.batch_size, tuned.runtime.threads) == (
        fastest["engine"], fastest["precision"], fastest["batch_size"], fastest["threads"]
    )  # fmt: skip
    failed = [c for c in measured if not c["passed"]]
    assert {(c["engine"], c["precision"]) for c in failed} == {("onnxruntime", "int8")}
    assert all(c["quality"]["mean_cosine"] < 0.9999 and c["rows_per_s"] is None for c in failed)
    assert {(c["engine"], c["precision"]) for c in passing} == {("onnxruntime", "fp32"), ("torch", "fp32")}
    same = [
        c
        for c in measured
        if (c["engine"], c["precision"]) == ("onnxruntime", "fp32") and c["threads"] == available_cpus()
    ]
    assert sorted(c["batch_size"] for c in same) == [8, 12]
    expect = max(same, key=lambda c: c["rows_per_s"])["batch_size"]
    auto = cli(
        "run", "job.toml", "-o", "out-auto", "--set", "runtime.batch_size=auto", "--progress", "none", cwd=tmp_path
    )
    assert auto.returncode == 0, auto.stderr
    assert f"runtime.batch_size = auto: {expect} (measured by bulkinfer tune" in auto.stderr
    report = json.loads((tmp_path / "out-auto" / "_bulkinfer" / "report.json").read_text())
    assert report["batch_size"] == expect


def test_auto_batch_size_without_a_tune_result_uses_the_models_default_else_16(tmp_path):
    write(make_catalog(30, seed=2), tmp_path / "c.parquet")
    (tmp_path / "m.py").write_text("def n(t):\n    return {'n': [len(x) for x in t['title'].to_pylist()]}\n")
    proc = cli(
        "run", "-i", "c.parquet", "-m", "m:n", "--feature-columns", "title", "-o", "out",
        "--set", "runtime.batch_size=auto", "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "runtime.batch_size = auto: 16 (no tune result for this model on this machine" in proc.stderr
    assert json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())["batch_size"] == 16
    # a tabular model's own default (one call per window of rows), not 16
    from helpers import tabular_table, train_classifier

    write(tabular_table(500), tmp_path / "t.parquet")
    train_classifier(tmp_path / "m.joblib")
    proc = cli("run", "-i", "t.parquet", "-m", "m.joblib", "--feature-columns", "x1,x2,x3", "-o", "tab",
               "--set", "runtime.batch_size=auto", "--progress", "none", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        "runtime.batch_size = auto: 65536 (no tune result for this model on this machine; using the model's "
        "default, 65536" in proc.stderr
    )
    assert json.loads((tmp_path / "tab" / "_bulkinfer" / "report.json").read_text())["batch_size"] == 65536


SINGLE_THREADED = """
def loop(table):
    # pure Python: one core whatever the machine has
    return {"y": [sum(i * i for i in range(150)) + v for v in table["x1"].to_pylist()]}
"""


def test_tune_measures_one_process_against_one_per_cpu_for_a_model_without_precisions(tmp_path, monkeypatch):
    """A single-threaded model: tune measures one process (all CPUs' threads) and one process
    per CPU on the job's rows; the tuned job takes the second (the Ray backend, num_cpus = 1)
    exactly when it measured 1.2x faster, and runs."""
    from helpers import tabular_table

    write(tabular_table(3000), tmp_path / "in.parquet")
    (tmp_path / "single.py").write_text(SINGLE_THREADED)
    (tmp_path / "job.toml").write_text(
        '[source]\npaths = ["in.parquet"]\nid_column = "id"\n[model]\nname = "single:loop"\n'
        'feature_columns = ["x1"]\n[sink]\npath = "out"\n'
    )
    env = {"PYTHONPATH": str(tmp_path)}
    monkeypatch.syspath_prepend(str(tmp_path))  # the model's digest here is the one the CLI computed
    monkeypatch.chdir(tmp_path)
    proc = cli("tune", "job.toml", cwd=tmp_path, env={**__import__("os").environ, **env}, check=True)
    cfg = load_config(tmp_path / "job.toml")
    measured = json.loads(results_path(cfg, resolve_model(cfg).digest).read_text())["candidates"]
    cpus = available_cpus()
    assert [c["processes"] for c in measured] == ([1, cpus] if cpus > 1 else [1])
    one = measured[0]
    assert one["cpu_per_wall"] < 1.5 and one["rows_per_s"] > 0  # one core, though the process may use all
    tuned = load_config(tmp_path / "job.tuned.toml")
    split = cpus > 1 and measured[1]["rows_per_s"] >= 1.2 * one["rows_per_s"]
    assert (tuned.execution.backend == "ray") == split, (measured, proc.stdout)
    if split:
        assert (tuned.execution.workers, tuned.execution.num_cpus, tuned.runtime.threads) == (cpus, 1.0, 1)
        assert f"{cpus} processes: execution.backend = ray" in proc.stdout
    assert "rows of the job's input on x86_64:" in proc.stderr or "rows of the job's input on aarch64:" in proc.stderr
    auto = cli("run", "job.toml", "-o", "out-auto", "--set", "runtime.batch_size=auto", "--progress", "none",
               cwd=tmp_path, env={**__import__("os").environ, **env})  # fmt: skip
    assert auto.returncode == 0, auto.stderr
    assert f"runtime.batch_size = auto: {measured[0]['batch_size']} (measured by bulkinfer tune" in auto.stderr
    cli("run", "job.tuned.toml", "--progress", "none", cwd=tmp_path, env={**__import__("os").environ, **env},
        check=True)  # fmt: skip
    out = read_output(tmp_path / "out").sort_by("id")
    assert out["id"].to_pylist() == list(range(3000))
    x1 = tabular_table(3000)["x1"].to_pylist()
    assert out["y"].to_pylist() == [sum(i * i for i in range(150)) + v for v in x1]


def test_tune_measures_a_picture_model_and_writes_a_runnable_job(tmp_path):
    from bulkinfer.core.hardware import emulated

    from pictures import write_photos

    names = write_photos(tmp_path / "photos", 8, scale=0.4)
    (tmp_path / "job.toml").write_text(
        '[source]\npaths = ["photos/*.jpg"]\n[model]\nname = "nudenet"\n[sink]\npath = "out"\n'
    )
    proc = cli("tune", "job.toml", "--sample-rows", "8", "--batch-sizes", "1,4", cwd=tmp_path, check=True)
    assert "wrote job.tuned.toml" in proc.stdout and "<- chosen" in proc.stderr
    cfg = load_config(tmp_path / "job.toml")
    candidates = json.loads(results_path(cfg, resolve_model(cfg).digest).read_text())["candidates"]
    skipped = [c for c in candidates if c.get("note") == "emulated here: not measured"]
    measured = [c for c in candidates if c not in skipped]
    pairs = {(c["engine"], c["precision"]) for c in measured}
    bf16 = {("openvino", "bf16")}
    emulated_here = emulated("cpu", "bf16")  # an AVX2-only CPU: bf16 is listed as not measured, never chosen
    assert pairs == {("onnxruntime", "fp32"), ("openvino", "fp32")} | (set() if emulated_here else bf16)
    assert {(c["engine"], c["precision"]) for c in skipped} == (bf16 if emulated_here else set())
    assert not any(c["passed"] for c in skipped)
    assert {c["batch_size"] for c in measured} == {1, 4}
    for c in measured:
        if c["precision"] == "bf16":  # gated on the boxes fp32 finds
            assert c["quality"]["boxes_fp32"] > 0 and c["passed"] == (c["quality"]["boxes_matched"] >= 0.99)
    tuned = load_config(tmp_path / "job.tuned.toml")
    fastest = max((c for c in measured if c["passed"]), key=lambda c: c["rows_per_s"])
    assert (tuned.runtime.engine, tuned.runtime.precision, tuned.runtime.batch_size) == (
        fastest["engine"], fastest["precision"], fastest["batch_size"]
    )  # fmt: skip
    cli("run", "job.tuned.toml", "--progress", "none", cwd=tmp_path, check=True)
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == sorted(names)
