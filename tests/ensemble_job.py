"""A several-model job over rows the tests share (local and on Ray): three small models, one
reading another's list column and one failing on some rows, a decision and two routes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from helpers import fresh_module, write

MODELS = """
import numpy as np
from bulkinfer.adapters import Adapter


def score(table):
    return {"p": np.asarray(table.column("x").to_pylist(), dtype=np.float64) / 100.0}


class Words(Adapter):
    output_columns = ("tokens",)

    def predict(self, batch):
        texts = batch.column("text").to_pylist()
        if any("boom" in t for t in texts):
            raise RuntimeError("boom in the text")
        return {"tokens": [[{"word": w, "len": len(w)} for w in t.split()] for t in texts]}


class Longest(Adapter):
    def predict(self, batch):
        tokens = batch.column("words.tokens").to_pylist()
        return {"longest": [max((d["len"] for d in t), default=0) for t in tokens]}
"""

N = 100


def text(i: int) -> str:
    if i % 25 == 7:
        return "boom goes here"
    if i % 10 == 3:
        return "a bad word"
    return "incomprehensibilities" if i % 10 == 5 else f"row {i}"


BOOM = {i for i in range(N) if i % 25 == 7}
BLOCK = set(range(90, N))
REVIEW = {
    i for i in range(N) if i not in BLOCK and (i in BOOM or "bad" in text(i) or len(max(text(i).split(), key=len)) > 8)
}
PUBLISH = set(range(N)) - BLOCK - REVIEW


def job(tmp_path, monkeypatch) -> str:
    module = fresh_module(tmp_path, monkeypatch, "ensemble_models", MODELS)
    write(
        pa.table({"id": np.arange(N), "x": np.arange(N), "text": [text(i) for i in range(N)]}), tmp_path / "in.parquet"
    )
    (tmp_path / "job.toml").write_text(f"""
[source]
paths = ["in.parquet"]
id_column = "id"
shard_rows = 25

[models.scorer]
name = "{module}:score"
feature_columns = ["x"]

[models.longest]
name = "{module}:Longest"
feature_columns = ["words.tokens"]

[models.words]
name = "{module}:Words"
text_column = "text"
batch_size = 8

[decision]
default = "publish"
on_error = "review"

[decision.rules]
block = "scorer.p >= 0.9"
review = "any(words.tokens[word == 'bad']) or longest.longest > 8"

[sink]
path = "out"

[[route]]
name = "review"
when = "decision == 'review'"
[[route.export]]
kind = "folder"
path = "review"

[[route]]
name = "block"
when = "decision == 'block'"
[[route.export]]
kind = "folder"
path = "blocked"
""")
    monkeypatch.chdir(tmp_path)
    return module


def check_on_a_cluster(tmp_path, monkeypatch, backend: str) -> None:
    """The job on ``backend`` (ray, spark) equals it run locally: every row in the same place with
    the same columns, the same route counts, and each model's figures in the driver's report."""
    from bulkinfer import load_config, run_job

    job(tmp_path, monkeypatch)
    local = run_job(load_config(tmp_path / "job.toml"))
    remote = run_job(load_config(tmp_path / "job.toml", overrides={
        "execution.backend": backend, "sink.path": f"{backend}-out", "route": [
            {"name": "review", "when": "decision == 'review'", "export": [{"kind": "folder", "path": f"{backend}-review"}]},
            {"name": "block", "when": "decision == 'block'", "export": [{"kind": "folder", "path": f"{backend}-blocked"}]},
        ]}))  # fmt: skip

    def every_row(*folders):
        tables = [
            pads.dataset(tmp_path / f, format="parquet").to_table().drop_columns(["_input_hash"]) for f in folders
        ]
        return pa.concat_tables(tables).sort_by("id")

    assert every_row(f"{backend}-out", f"{backend}-review", f"{backend}-blocked").equals(
        every_row("out", "review", "blocked")
    )
    assert remote.report["routes"] == local.report["routes"]
    assert {n: (m["rows"], m["failed"]) for n, m in remote.report["models"].items()} == {
        "scorer": (N, 0), "words": (N, len(BOOM)), "longest": (N - len(BOOM), 0)
    }  # fmt: skip
