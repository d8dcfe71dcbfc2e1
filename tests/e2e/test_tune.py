from __future__ import annotations

from bulkinfer import load_config

from helpers import cli, make_catalog, read_output, write


def test_tune_picks_a_gate_passing_candidate_and_writes_a_runnable_job(tmp_path):
    write(make_catalog(120, seed=4), tmp_path / "data" / "c.parquet")
    (tmp_path / "job.toml").write_text(
        '[source]\npaths = ["data/c.parquet"]\nid_column = "id"\n[model]\nname = "minilm"\n'
        'text_column = "description"\n[runtime]\nquality_floor = 0.9999\n[sink]\npath = "out"\n'
    )
    proc = cli("tune", "job.toml", "--sample-rows", "48", "--batch-sizes", "8,16", cwd=tmp_path, check=True)
    assert "wrote job.tuned.toml" in proc.stdout
    table = proc.stderr
    assert "<- chosen" in table and "FAIL" in table  # int8 cannot meet a 0.9999 floor
    tuned = load_config(tmp_path / "job.tuned.toml")
    assert (tuned.runtime.engine, tuned.runtime.precision) != ("onnxruntime", "int8")
    assert tuned.runtime.batch_size in (8, 16) and tuned.model.text_column == "description"
    chosen = proc.stdout.split("chosen: ")[1]
    assert chosen.startswith(f"{tuned.runtime.engine} {tuned.runtime.precision}, batch {tuned.runtime.batch_size}")
    cli("run", "job.tuned.toml", "--progress", "none", cwd=tmp_path, check=True)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(120))
