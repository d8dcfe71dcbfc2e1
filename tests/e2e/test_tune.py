from __future__ import annotations

import json

from bulkinfer import load_config
from bulkinfer.adapters import available_cpus, resolve_model
from bulkinfer.tune import results_path

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
    tuned = load_config(tmp_path / "job.tuned.toml")
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


def test_auto_batch_size_without_a_tune_result_uses_16(tmp_path):
    write(make_catalog(30, seed=2), tmp_path / "c.parquet")
    (tmp_path / "m.py").write_text("def n(t):\n    return {'n': [len(x) for x in t['title'].to_pylist()]}\n")
    proc = cli(
        "run", "-i", "c.parquet", "-m", "m:n", "--feature-columns", "title", "-o", "out",
        "--set", "runtime.batch_size=auto", "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "runtime.batch_size = auto: 16 (no tune result for this model on this machine" in proc.stderr
    assert json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())["batch_size"] == 16
