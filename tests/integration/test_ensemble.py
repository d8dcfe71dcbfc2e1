"""Several models in one job ([models.<name>]) over rows: a model reading another's column, a
model failing on some rows (its readers skip them, the others keep their columns), the
decision rules over list columns, and the routes acting on the decision, each row in exactly
one place across a SIGKILL."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from bulkinfer import BulkinferError, load_config, run_job

from ensemble_job import BLOCK, BOOM, PUBLISH, REVIEW, N, job
from helpers import crash_then_rerun, read_output


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
    crash_then_rerun(tmp_path, "exported:2", {"PYTHONPATH": str(tmp_path)})
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

