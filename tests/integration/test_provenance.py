"""Every part carries its provenance in Parquet key-value metadata; ``bulkinfer inspect FILE``
prints it, and says whether the output's ``_SUCCESS`` vouches for the file."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq

from bulkinfer import load_config, run_job
from bulkinfer.outputs.status import inspect_part

from helpers import cli, tabular_table, train_classifier, write


def test_parts_say_where_they_came_from(tmp_path):
    model = train_classifier(tmp_path / "m.joblib")
    write(tabular_table(900, seed=1), tmp_path / "a.parquet")
    write(tabular_table(300, seed=2, start=900), tmp_path / "b.parquet")
    cfg = load_config(overrides={
        "source.paths": [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], "model.name": str(model),
        "source.id_column": "id", "sink.path": str(tmp_path / "out"), "source.shard_rows": 400,
        "execution.progress": "none",
    })  # fmt: skip
    run_job(cfg)
    job = json.loads((tmp_path / "out" / "_bulkinfer" / "job.json").read_text())
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert len(manifest["files"]) == 4  # 400 + 400 + 100 rows of a, 300 of b
    for f in manifest["files"]:
        meta = pq.read_metadata(tmp_path / "out" / f["name"]).metadata
        p = json.loads(meta[b"bulkinfer"])
        assert p["job_fingerprint"] == job["fingerprint"] and p["model_digest"] == job["model_digest"]
        assert p["model_kind"] == "tabular" and p["model"] == str(model) and p["bulkinfer_version"]
        shard = job["shards"][f["shard"]]
        assert p["input"] == shard["uri"] and p["input_rows"] == [f["start"], f["stop"]]
        assert p["shard"] == f["shard"]
    last = manifest["files"][-1]
    assert json.loads(pq.read_metadata(tmp_path / "out" / last["name"]).metadata[b"bulkinfer"])["input"].endswith(
        "b.parquet"
    )

    # a part copied elsewhere still says where it came from; inspect tells it is not vouched for there
    name = manifest["files"][1]["name"]
    shutil.copy(tmp_path / "out" / name, tmp_path / name)
    here = inspect_part(str(tmp_path / "out" / name))
    away = inspect_part(str(tmp_path / name))
    assert here["in_manifest"] is True and away["in_manifest"] is None
    assert here["provenance"] == away["provenance"] and here["rows"] == 400
    proc = cli("inspect", str(tmp_path / name), check=True)
    assert "input_rows" not in proc.stdout and "rows 400-800 (shard 1)" in proc.stdout
    assert job["fingerprint"] in proc.stdout and "no _SUCCESS beside it" in proc.stdout

    (tmp_path / "out" / name).write_bytes((tmp_path / "out" / manifest["files"][0]["name"]).read_bytes())
    assert inspect_part(str(tmp_path / "out" / name))["in_manifest"] is False  # replaced: not the committed file
    bad = cli("inspect", str(tmp_path / "a.csv"))
    assert bad.returncode == 1 and "only Parquet parts" in bad.stderr
