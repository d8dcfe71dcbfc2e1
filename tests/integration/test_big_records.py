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


def _run_with_limit(tmp_path, path, **extra):
    model = train_classifier(tmp_path / "m.joblib")
    cfg = load_config(overrides={
        "source.paths": [str(path)], "model.name": str(model), "source.id_column": "id",
        "model.feature_columns": ["x1", "x2", "x3"], "sink.path": str(tmp_path / "out"),
        "source.max_record_bytes": 1000, "source.shard_rows": 4, "execution.progress": "none", **extra,
    })  # fmt: skip
    result = run_job(cfg)
    errors = [json.loads(x) for p in (tmp_path / "out" / "_errors").glob("*.jsonl") for x in p.read_text().splitlines()]
    return result, errors


def test_a_csv_record_over_the_limit_is_an_error_row_even_a_quoted_multiline_one(tmp_path):
    lines = ["id,x1,x2,x3,note"]
    for i in range(21):
        note = {7: "z" * 3000, 15: '"' + "line\n" * 400 + '"'}.get(i, "ok")
        lines.append(f"{i},{0.1 * i},{-0.2 * i},{i % 5},{note}")
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    result, errors = _run_with_limit(tmp_path, tmp_path / "in.csv", **{"sink.keep_columns": ["note"]})
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == [i for i in range(21) if i not in (7, 15)]
    sizes = {7: len(lines[8]) + 1, 15: len(lines[16]) + 1}
    assert {e["row"]: e["message"] for e in errors} == {
        r: f"the record is {n} bytes, over source.max_record_bytes; split it or raise the limit"
        for r, n in sizes.items()
    }
    assert result.report["rows_out"] == 19


def test_a_parquet_row_whose_values_pass_the_limit_is_an_error_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    notes = ["ok"] * 21
    notes[9] = "n" * 2500
    t = pa.table({"id": list(range(21)), "x1": [0.1 * i for i in range(21)], "x2": [-0.2 * i for i in range(21)],
                  "x3": [i % 5 for i in range(21)], "note": notes})  # fmt: skip
    pq.write_table(t, tmp_path / "in.parquet", row_group_size=4)
    result, errors = _run_with_limit(tmp_path, tmp_path / "in.parquet", **{"sink.keep_columns": ["note"]})
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == [i for i in range(21) if i != 9]
    assert [(e["row"], e["message"]) for e in errors] == [
        (9, "the record is 2500 bytes, over source.max_record_bytes; split it or raise the limit")
    ]
    # a long value in a column the job does not read is never measured (nor read)
    result, errors = _run_with_limit(tmp_path, tmp_path / "in.parquet", **{"sink.path": str(tmp_path / "out2")})
    assert result.report["rows_out"] == 21 and not (tmp_path / "out2" / "_errors").exists()
