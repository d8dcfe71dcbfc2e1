"""Records of any length: a JSONL record over source.max_record_bytes is an error row naming
its size (its bytes are never read), the rows around it run; a first record longer than
the sampling window does not hide the file's columns."""

from __future__ import annotations

import json

from bulkinfer import load_config, run_job

from helpers import read_output, train_classifier


def rows(n, start=0):
    return [{"id": start + i, "x1": 0.1 * i, "x2": -0.2 * i, "x3": i % 5} for i in range(n)]


def test_a_record_over_the_limit_is_an_error_row_and_the_rest_runs(tmp_path):
    model = train_classifier(tmp_path / "m.joblib")
    big = {"id": 10, "x1": 1.0, "x2": 2.0, "x3": 3, "note": "z" * 5000}
    records = [*rows(10), big, *rows(10, start=11)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = load_config(overrides={
        "source.paths": [str(tmp_path / "in.jsonl")], "model.name": str(model), "source.id_column": "id",
        "model.feature_columns": ["x1", "x2", "x3"], "sink.path": str(tmp_path / "out"),
        "source.max_record_bytes": 1000, "source.shard_rows": 4, "execution.progress": "none",
    })  # fmt: skip
    result = run_job(cfg)
    assert result.report["rows_failed"] == 1 and result.report["rows_out"] == 20
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == [i for i in range(21) if i != 10]
    errors = (tmp_path / "out" / "_errors").glob("*.jsonl")
    (record,) = [json.loads(x) for p in errors for x in p.read_text().splitlines()]
    size = len(json.dumps(big)) + 1
    assert record["row"] == 10 and f"the record is {size} bytes, over source.max_record_bytes" in record["message"]


def test_a_first_record_longer_than_the_sampling_window_keeps_the_columns(tmp_path):
    model = train_classifier(tmp_path / "m.joblib")
    first = {"id": 0, "x1": 0.5, "x2": 0.5, "x3": 1, "note": "y" * (3 << 20)}  # 3 MiB: past the 1 MiB head
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [first, *rows(5, start=1)]))
    cfg = load_config(overrides={
        "source.paths": [str(tmp_path / "in.jsonl")], "model.name": str(model), "source.id_column": "id",
        "model.feature_columns": ["x1", "x2", "x3"], "sink.path": str(tmp_path / "out"), "execution.progress": "none",
    })  # fmt: skip
    result = run_job(cfg)
    assert result.report["rows_out"] == 6 and result.report["rows_failed"] == 0
