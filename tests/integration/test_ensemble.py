"""Several models in one job ([models.<name>]) over rows: a model reading another's column, a
model failing on some rows (its readers skip them, the others keep their columns), the
decision rules over list columns, and the routes acting on the decision, each row in exactly
one place across a SIGKILL."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from bulkinfer import BulkinferError, load_config, run_job

from helpers import BULKINFER, fresh_module, read_output, write

MODELS = '''
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
'''

N = 100


def text(i: int) -> str:
    if i % 25 == 7:
        return "boom goes here"
    if i % 10 == 3:
        return "a bad word"
    return "incomprehensibilities" if i % 10 == 5 else f"row {i}"


BOOM = {i for i in range(N) if i % 25 == 7}
BLOCK = set(range(90, N))
REVIEW = {i for i in range(N) if i not in BLOCK and (i in BOOM or "bad" in text(i) or len(max(text(i).split(), key=len)) > 8)}
PUBLISH = set(range(N)) - BLOCK - REVIEW


def job(tmp_path, monkeypatch) -> str:
    module = fresh_module(tmp_path, monkeypatch, "ensemble_models", MODELS)
    write(pa.table({"id": np.arange(N), "x": np.arange(N), "text": [text(i) for i in range(N)]}), tmp_path / "in.parquet")
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


def folder(path) -> pa.Table:
    return pads.dataset(path, format="parquet").to_table()


def check_each_row_once(tmp_path) -> tuple[pa.Table, pa.Table]:
    out, review, blocked = read_output(tmp_path / "out"), folder(tmp_path / "review"), folder(tmp_path / "blocked")
    assert sorted(out["id"].to_pylist()) == sorted(PUBLISH)
    assert sorted(review["id"].to_pylist()) == sorted(REVIEW)
    assert sorted(blocked["id"].to_pylist()) == sorted(BLOCK)
    assert set(out["decision"].to_pylist()) == {"publish"} and set(blocked["decision"].to_pylist()) == {"block"}
    return out, review


def test_models_read_each_other_fail_alone_and_the_decision_routes_each_row_once(tmp_path, monkeypatch):
    job(tmp_path, monkeypatch)
    result = run_job(load_config(tmp_path / "job.toml"))
    _out, review = check_each_row_once(tmp_path)
    rows = {r["id"]: r for r in review.to_pylist()}
    boom = rows[32]  # words failed: longest (its reader) skipped it, scorer's column is kept
    assert boom["words.error"] == "model 'words': RuntimeError: boom in the text"
    assert boom["longest.error"] == "skipped: model 'words' failed on the row"
    assert boom["words.tokens"] is None and boom["longest.longest"] is None
    assert boom["scorer.p"] == pytest.approx(0.32) and boom["scorer.error"] is None
    assert rows[33]["words.tokens"] == [{"word": "a", "len": 1}, {"word": "bad", "len": 3}, {"word": "word", "len": 4}]
    assert rows[35]["longest.longest"] == 21 and rows[35]["words.error"] is None  # beside a failing row, answered
    models = result.report["models"]
    assert {n: (m["rows"], m["failed"]) for n, m in models.items()} == {
        "scorer": (N, 0), "words": (N, len(BOOM)), "longest": (N - len(BOOM), 0)
    }  # fmt: skip
    assert list(models) == ["scorer", "words", "longest"]  # the order they ran in: longest reads words
    assert result.report["routes"] == {"default": len(PUBLISH), "review": len(REVIEW), "block": len(BLOCK)}


def test_a_killed_decision_job_routes_every_row_once_after_the_rerun(tmp_path, monkeypatch):
    job(tmp_path, monkeypatch)
    env = {**os.environ, "BULKINFER_CRASH_AT": "exported:2", "PYTHONPATH": str(tmp_path)}
    args = [*BULKINFER, "run", "job.toml", "--progress", "none"]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    env.pop("BULKINFER_CRASH_AT")
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    check_each_row_once(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"models.words.text_column": "longest.longest"},
         r"models: longest, words read each other's columns in a cycle; break it"),
        ({"models.words.text_column": "words.tokens"}, r"models\.words: reads its own columns"),
        ({"decision.rules": {"block": "max(words.tokns.len) > 3"}},
         r"decision\.rules\.block: reads 'words\.tokns\.len', which model 'words' does not write \(it writes words\.tokens\)"),
        ({"models.longest.feature_columns": ["wrds.tokens"]}, r"column 'wrds\.tokens' is not in .*in\.parquet"),
        ({"models.scorer.precision": "int8"}, r"models\.scorer\.precision = int8: a several-model job runs each model"),
        ({"model.name": "minilm"}, r"model\.name: a job runs \[model\] or \[models\.<name>\] tables, not both"),
    ],
)  # fmt: skip
def test_a_broken_graph_or_rule_is_refused_before_any_row_runs(tmp_path, monkeypatch, change, message):
    job(tmp_path, monkeypatch)
    cfg = load_config(tmp_path / "job.toml", overrides=change)
    with pytest.raises(BulkinferError, match=message):
        run_job(cfg)
    assert not list(tmp_path.glob("out/part-*"))  # no row ran
