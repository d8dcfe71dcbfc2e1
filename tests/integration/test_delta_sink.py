"""sink.format = "delta": the output folder is a Delta table, one idempotent commit per part;
SIGKILL after a part's file is in place but before its Delta commit, or after the Delta
commit but before the ledger line, then a rerun: every id exactly once in the table's
latest version, as deltalake reads it, and the killed part's error row recorded once."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from bulkinfer import load_config, run_job

from helpers import cli, read_output, tabular_table, train_classifier

ROWS = 300
BAD = 120  # x1 = "oops": an error row in the third part
GOOD = [i for i in range(ROWS) if i != BAD]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("delta")
    records = tabular_table(ROWS).to_pylist()
    records[BAD]["x1"] = "oops"
    (d / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d, train_classifier(d / "model.joblib")


def args(d, model, out):
    return ["run", "-i", str(d / "in.jsonl"), "-m", str(model), "--id-column", "id", "--feature-columns",
            "x1,x2,x3", "--shard-rows", "50", "--format", "delta", "-o", str(out), "--progress", "none"]  # fmt: skip


def test_each_part_is_a_delta_commit_and_the_table_equals_the_parquet_output(job, tmp_path):
    d, model = job
    base = {"source.paths": [str(d / "in.jsonl")], "model.name": str(model), "source.id_column": "id",
            "model.feature_columns": ["x1", "x2", "x3"], "source.shard_rows": 50, "execution.progress": "none"}  # fmt: skip
    run_job(load_config(overrides={**base, "sink.path": str(tmp_path / "files")}))
    result = run_job(load_config(overrides={**base, "sink.path": str(tmp_path / "table"), "sink.format": "delta"}))
    assert result.report["rows_out"] == ROWS - 1 and result.report["rows_failed"] == 1
    table = DeltaTable(str(tmp_path / "table"))
    assert table.version() == ROWS // 50 - 1  # a commit per part (the first creates the table)
    assert sorted({h["operation"] for h in table.history()}) == ["CREATE TABLE", "WRITE"]
    got = table.to_pyarrow_table().sort_by("id")
    want = read_output(tmp_path / "files").sort_by("id").drop_columns(["_input_hash"])  # only Parquet has them
    assert got.column_names == want.column_names and got.equals(want)
    assert table.transaction_version("bulkinfer/part-00003") == 1


@pytest.mark.parametrize("point", ["part-renamed:3", "delta-committed:3"])
def test_sigkill_around_the_delta_commit_then_rerun_is_exactly_once(job, tmp_path, point):
    d, model = job
    out = tmp_path / "out"
    killed = cli(*args(d, model, out), env={**os.environ, "BULKINFER_CRASH_AT": point})
    assert killed.returncode == -9
    commits = (out / "_bulkinfer" / "commits.log").read_text().count("\n")
    assert commits == 2  # the 3rd part reached its file (or its Delta commit), not the ledger
    in_table = DeltaTable(str(out)).to_pyarrow_table().num_rows
    assert in_table == (149 if point.startswith("delta") else 100)
    cli(*args(d, model, out), check=True)
    ids = DeltaTable(str(out)).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == GOOD  # every id once in the latest version
    assert pa.Table.equals(read_output(out).select(["id"]).sort_by("id"), pa.table({"id": GOOD}))
    errors = [json.loads(x) for p in (out / "_errors").glob("*.jsonl") for x in p.read_text().splitlines()]
    assert [e["row"] for e in errors] == [BAD]  # the redone part's error row, published once
