"""Bad rows become error records; every other row is written; the budget stops the job."""

from __future__ import annotations

import json
import sys
import textwrap

import pyarrow as pa
import pytest

from bulkinfer import ErrorBudgetExceeded, load_config, run_job

from helpers import job_config, read_output, tabular_table, write

FLAKY = textwrap.dedent('''
    from bulkinfer import Adapter

    CALLS = []

    class Picky(Adapter):
        """Fails in predict on ids listed in options.bad_predict, in preprocess on bad_pre."""
        input_columns = ("id", "x1")

        def __init__(self, bad_predict=(), bad_pre=(), delete_on_setup=None):
            self.bad_predict, self.bad_pre = set(bad_predict), set(bad_pre)
            self.delete_on_setup = delete_on_setup

        def setup(self, ctx):
            if self.delete_on_setup:  # after planning, before reading
                import os
                os.unlink(self.delete_on_setup)

        def preprocess(self, table):
            ids = table["id"].to_pylist()
            hit = self.bad_pre & set(ids)
            if hit:
                raise ValueError(f"cannot parse id {min(hit)}")
            return table

        def predict(self, batch):
            CALLS.append(batch.num_rows)
            ids = batch["id"].to_pylist()
            hit = self.bad_predict & set(ids)
            if hit:
                raise RuntimeError(f"model blew up on id {min(hit)}")
            return {"y": [x * 10 for x in batch["x1"].to_pylist()]}
''')


@pytest.fixture()
def flaky(tmp_path, monkeypatch):
    (tmp_path / "flaky.py").write_text(FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__("flaky")
    sys.modules.pop("flaky", None)


def _cfg(tmp_path, **extra):
    base = {"model.name": "flaky:Picky", "source.shard_rows": 250, "runtime.batch_size": 64,
            "execution.max_error_rate": 0.01}  # fmt: skip
    return job_config(tmp_path / "out", [tmp_path / "in.parquet"], **{**base, **extra})


def _errors(out):
    return [json.loads(line) for f in sorted((out / "_errors").iterdir()) for line in f.read_text().splitlines()]


def test_bad_rows_are_isolated_and_recorded(tmp_path, flaky):
    t = tabular_table(1000)
    write(t, tmp_path / "in.parquet", row_group_size=250)
    result = run_job(_cfg(tmp_path, **{"model.options": {"bad_predict": [7, 600], "bad_pre": [321]}}))
    out = read_output(tmp_path / "out")
    expect_ids = [i for i in range(1000) if i not in (7, 321, 600)]
    assert out["id"].to_pylist() == expect_ids
    assert out["y"].to_pylist() == pytest.approx([t["x1"][i].as_py() * 10 for i in expect_ids])
    errs = sorted(_errors(tmp_path / "out"), key=lambda e: e["row"])
    assert [(e["row"], e["id"], e["stage"], e["error_type"]) for e in errs] == [
        (7, 7, "predict", "RuntimeError"),
        (321, 321, "preprocess", "ValueError"),
        (600, 600, "predict", "RuntimeError"),
    ]
    assert errs[0]["input"] == str(tmp_path / "in.parquet") and errs[0]["message"] == "model blew up on id 7"
    assert result.report["rows_failed"] == 3 and result.report["rows_out"] == 997
    # each bad row costs about log2(batch) extra calls, not a call per row
    assert len(flaky.CALLS) < 1000 / 64 + 2 * 2 * 7
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert manifest["rows"] == 997 and manifest["rows_failed"] == 3
    assert manifest["error_files"] == [
        "_errors/part-00000.jsonl",
        "_errors/part-00001.jsonl",
        "_errors/part-00002.jsonl",
    ]


def test_budget_exceeded_stops_with_the_figures_and_keeps_commits(tmp_path, flaky):
    write(tabular_table(1000), tmp_path / "in.parquet", row_group_size=250)
    bad = list(range(300, 320))
    cfg = _cfg(tmp_path, **{"model.options": {"bad_predict": bad}, "execution.max_errors": 5})
    with pytest.raises(ErrorBudgetExceeded) as err:
        run_job(cfg)
    msg = str(err.value)
    assert "20 rows failed, over the error budget of 5" in msg and "execution.max_errors=5" in msg
    assert "_errors" in msg and "model blew up on id 300" in msg
    # the first shard and the one with the errors are committed; a rerun refuses at once
    assert read_output(tmp_path / "out")["id"].to_pylist() == [i for i in range(500) if i not in bad]
    with pytest.raises(ErrorBudgetExceeded, match="20 rows already failed"):
        run_job(cfg)
    raised = _cfg(
        tmp_path,
        **{"model.options": {"bad_predict": bad}, "execution.max_errors": 50, "execution.max_error_rate": 0.05},
    )
    assert run_job(raised).report["rows_out"] == 500


def test_null_and_odd_texts(tmp_path, minilm_path):
    texts = ["fine text", None, "", "   ", "x" * 200_000]
    write(pa.table({"id": list(range(5)), "t": texts}), tmp_path / "in.parquet")
    cfg = load_config(
        overrides={
            "source.paths": [str(tmp_path / "in.parquet")],
            "model.name": str(minilm_path),
            "model.text_column": "t",
            "source.id_column": "id",
            "sink.path": str(tmp_path / "out"),
            "execution.progress": "none",
            "execution.max_errors": 1,
            "execution.max_error_rate": 1.0,
        }
    )
    run_job(cfg)
    assert read_output(tmp_path / "out")["id"].to_pylist() == [0, 2, 3, 4]
    (err,) = _errors(tmp_path / "out")
    assert (err["row"], err["id"], err["stage"]) == (1, 1, "preprocess") and "null" in err["message"]


def test_file_vanishing_after_planning_becomes_error_records(tmp_path, flaky):
    write(tabular_table(300), tmp_path / "in" / "a.parquet")
    write(tabular_table(300, start=300), tmp_path / "in" / "b.parquet")
    cfg = _cfg(
        tmp_path,
        **{
            "source.paths": [str(tmp_path / "in")],
            "execution.max_error_rate": 0.5,
            "model.options": {"delete_on_setup": str(tmp_path / "in" / "b.parquet")},
        },
    )
    result = run_job(cfg)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(300))
    errs = _errors(tmp_path / "out")  # one record per shard of the missing file (shard_rows=250)
    b = str(tmp_path / "in" / "b.parquet")
    assert [(e["input"], e["row"], e["rows"], e["stage"]) for e in errs] == [(b, 0, 250, "read"), (b, 250, 50, "read")]
    assert "disappeared after planning" in errs[0]["message"]
    assert result.report["rows_failed"] == 300


def test_bad_files_are_skipped_with_one_record_each(tmp_path, flaky):
    d = tmp_path / "in"
    write(tabular_table(200), d / "a_good.parquet")
    data = (write(tabular_table(200, start=200), d / "b_truncated.parquet")).read_bytes()
    (d / "b_truncated.parquet").write_bytes(data[: len(data) // 2])
    (d / "c_empty.csv").write_bytes(b"")
    write(tabular_table(0), d / "d_zero_rows.parquet")
    write(tabular_table(100, start=500).drop_columns(["x1"]), d / "e_no_x1.parquet")
    (d / "f_garbage.parquet").write_bytes(b"PAR1 this is not parquet at all")
    cfg = _cfg(tmp_path, **{"source.paths": [str(d)], "execution.max_error_rate": 1.0, "execution.max_errors": 200})
    result = run_job(cfg)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(200))
    plan_errors = [json.loads(x) for x in (tmp_path / "out" / "_errors" / "inputs.jsonl").read_text().splitlines()]
    assert [(e["input"], e["stage"]) for e in plan_errors] == [
        (str(d / "b_truncated.parquet"), "plan"),
        (str(d / "f_garbage.parquet"), "plan"),
    ]
    assert all("not a readable Parquet file" in e["message"] for e in plan_errors)
    shard_errors = [e for e in _errors(tmp_path / "out") if e["stage"] != "plan"]
    assert [(e["input"], e["row"], e["rows"], e["stage"]) for e in shard_errors] == [
        (str(d / "e_no_x1.parquet"), 0, 100, "read")
    ]
    assert "column 'x1' not found" in shard_errors[0]["message"]
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert (manifest["rows"], manifest["rows_failed"], manifest["inputs_failed"]) == (200, 100, 2)
    assert result.report["rows_out"] == 200


def test_jsonl_bad_lines_become_error_rows(tmp_path, flaky):
    lines = [
        '{"id": 0, "x1": 1.0}',
        "not json",
        "[1, 2]",
        "",
        '{"id": 3, "x1": "abc"}',
        '{"id": 4}',
        '{"id": 5, "x1": 2.5}',
        '{"id": 6, "x1": 3}',
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
    cfg = _cfg(
        tmp_path, **{"source.paths": [str(tmp_path / "in")], "execution.max_error_rate": 1.0, "source.shard_rows": 4}
    )
    run_job(cfg)
    out = read_output(tmp_path / "out")
    assert out["id"].to_pylist() == [0, 5, 6] and out["y"].to_pylist() == [10.0, 25.0, 30.0]
    errs = sorted(_errors(tmp_path / "out"), key=lambda e: e["row"])
    # row 4 lacks x1: in its shard the fast reader makes it null, and the model fails on it
    assert [(e["row"], e["stage"]) for e in errs] == [(1, "read"), (2, "read"), (3, "read"), (4, "predict")]
    assert "invalid JSON" in errs[0]["message"] and "expected a JSON object, got list" in errs[1]["message"]
    assert "field 'x1' is str, expected double" in errs[2]["message"]


def test_csv_bom_crlf_read_ragged_rows_are_error_rows_and_a_broken_quote_or_a_latin1_byte_skips_the_file(
    tmp_path, flaky
):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_bytes(b"\xef\xbb\xbfid,x1\r\n0,1.5\r\n1,2.5\r\n")
    (d / "b_ragged.csv").write_bytes(b"id,x1\n10,1\n11,2,3\n\n12,3\n13\n")
    (d / "c_latin1.csv").write_bytes(b"id,x1,name\n20,1,caf\xe9\n")  # not UTF-8, even where the job does not read
    (d / "d_quote.csv").write_bytes(b'id,x1\n30,1\n31,"2\n')  # the quote is never closed
    cfg = _cfg(tmp_path, **{"source.paths": [str(d)], "execution.max_errors": 10, "execution.max_error_rate": 1.0})
    run_job(cfg)
    out = read_output(tmp_path / "out")
    assert out["id"].to_pylist() == [0, 1, 10, 12] and out["y"].to_pylist() == [15.0, 25.0, 10.0, 30.0]
    errs = {(e.get("input"), e.get("row")): e["message"] for e in _errors(tmp_path / "out")}
    ragged = str(d / "b_ragged.csv")
    assert errs[(ragged, 1)].endswith("CSV row has 3 fields, expected 2: 11,2,3")
    assert errs[(ragged, 3)].endswith("CSV row has 1 fields, expected 2: 13")
    assert errs[(str(d / "d_quote.csv"), None)].endswith(
        "d_quote.csv: the quoted value in the record at byte 11 is never closed; close the quote or remove the file"
    )
    assert errs[(str(d / "c_latin1.csv"), None)] == (
        f"{d / 'c_latin1.csv'}: byte 19 (0xE9) is not UTF-8; set source.encoding (--input-encoding) to the file's "
        "encoding, e.g. cp1252, latin-1, utf-16 or shift_jis, or convert the file to UTF-8"
    )
    assert len(errs) == 4


def test_out_of_memory_halves_the_batch_instead_of_failing_rows(tmp_path, monkeypatch):
    (tmp_path / "oom.py").write_text(
        textwrap.dedent("""
        from bulkinfer import Adapter

        class Big(Adapter):
            input_columns = ("x1",)

            def predict(self, batch):
                if batch.num_rows > 8:
                    raise MemoryError("cannot allocate")
                return {"y": batch["x1"]}
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tabular_table(300), tmp_path / "in.parquet")
    cfg = _cfg(
        tmp_path,
        **{"model.name": "oom:Big", "source.shard_rows": 100, "runtime.batch_size": 64, "runtime.sort_window": 50},
    )
    result = run_job(cfg)
    sys.modules.pop("oom", None)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(300))
    assert result.report["rows_failed"] == 0
    sizes = {int(k.split("-")[-1]) for k in result.report["batches"]["histogram"]}
    assert min(sizes) <= 8 < max(sizes)  # planned big at first, small once memory ran out


def test_corrupt_ledger_is_refused_then_repaired_without_recomputing(tmp_path, flaky):
    from bulkinfer import LedgerError
    from bulkinfer.commit.ledger import Ledger

    write(tabular_table(300), tmp_path / "in.parquet")
    cfg = _cfg(tmp_path, **{"model.options": {"bad_predict": [5, 150]}, "source.shard_rows": 100})
    run_job(cfg)
    before = Ledger(tmp_path / "out").commits()
    log = tmp_path / "out" / "_bulkinfer" / "commits.log"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text(lines[0] + lines[1].replace('"rows":99', '"rows":98') + lines[2])
    with pytest.raises(LedgerError, match="--repair"):
        run_job(cfg)
    repaired = _cfg(
        tmp_path, **{"model.options": {"bad_predict": [5, 150]}, "source.shard_rows": 100, "execution.repair": True}
    )
    result = run_job(repaired).report["latest_run"]  # this run's own figures (the report keeps the last run's)
    assert result["did_nothing"] and result["rows_out"] == 0 and result["rows_already_done"] == 300
    assert Ledger(tmp_path / "out").commits() == before
    log.write_text("")  # a lost ledger: the files themselves are enough
    assert run_job(repaired).report["latest_run"]["rows_out"] == 0
    assert Ledger(tmp_path / "out").commits() == before
    assert read_output(tmp_path / "out")["id"].to_pylist() == [i for i in range(300) if i not in (5, 150)]


def test_hung_call_times_out_and_only_its_row_fails(tmp_path, monkeypatch):
    (tmp_path / "hang.py").write_text(
        textwrap.dedent("""
        import threading
        from bulkinfer import Adapter

        release = threading.Event()

        class Hang(Adapter):
            input_columns = ("id", "x1")

            def predict(self, batch):
                if 42 in batch["id"].to_pylist():
                    release.wait(120)  # a call that hangs (a stuck remote service, a deadlocked kernel)
                return {"y": batch["x1"]}
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tabular_table(100), tmp_path / "in.parquet")
    # one row per call: the timeout (a second, far above a normal call of microseconds, so a busy
    # machine cannot trip it) hits row 42's call and its one retry, nothing else
    cfg = _cfg(
        tmp_path,
        **{
            "model.name": "hang:Hang",
            "runtime.batch_timeout_s": 1.0,
            "runtime.batch_size": 1,
            "execution.max_error_rate": 0.05,
        },
    )
    try:
        result = run_job(cfg)
    finally:
        sys.modules.pop("hang").release.set()  # lets the abandoned calls end
    assert read_output(tmp_path / "out")["id"].to_pylist() == [i for i in range(100) if i != 42]
    (err,) = _errors(tmp_path / "out")
    assert (err["row"], err["stage"], err["error_type"]) == (42, "predict", "BatchTimeout")
    assert "did not return within 1 s" in err["message"]
    assert result.report["run_s"] < 60  # the run did not wait for the hung call (it would for 120 s)


def test_text_that_is_not_utf8_fails_its_file_in_one_line_and_the_job_reads_the_others(tmp_path, flaky):
    """A latin-1 byte in a UTF-8 file is not a bad row to embed as best one can: the file is
    in another encoding, and its one line says where and what to set."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_bytes(b"id,x1\n0,1\n1,2\n2,3 # caf\xe9\n")
    (d / "b.csv").write_bytes(b"id,x1\n10,1\n")
    run_job(_cfg(tmp_path, **{"source.paths": [str(d)], "execution.max_errors": 10, "execution.max_error_rate": 1.0}))
    assert read_output(tmp_path / "out")["id"].to_pylist() == [10]
    (err,) = _errors(tmp_path / "out")
    assert (err["input"], err["row"], err["stage"]) == (str(d / "a.csv"), None, "plan")
    assert err["message"].startswith(f"{d / 'a.csv'}: byte 23 (0xE9) is not UTF-8; set source.encoding ")
    again = {"source.paths": [str(d)], "source.encoding": "latin-1", "sink.path": str(tmp_path / "o2")}
    run_job(_cfg(tmp_path, **again, **{"execution.max_errors": 10, "execution.max_error_rate": 1.0}))
    assert read_output(tmp_path / "o2")["id"].to_pylist() == [0, 1, 2, 10]


def test_columns_get_one_type_across_shards_and_files(tmp_path, flaky):
    """price is int64 where a shard or file starts with 10 and double where it holds 10.5:
    the job settles on double for every part, so the output reads as one table."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.csv").write_text("id,x1,price\n0,1,10\n1,2,11\n2,3,10.5\n")
    (d / "b.jsonl").write_text('{"id": 10, "x1": 1, "price": 7}\n{"id": 11, "x1": 2, "price": 7.25}\n')
    (d / "c.csv").write_text("id,x1,price\n20,1,5\n")
    cfg = _cfg(
        tmp_path,
        **{
            "source.paths": [str(d)],
            "source.shard_rows": 2,  # a.csv: [10, 11] alone reads as int64, [10.5] as double
            "sink.keep_columns": ["price"],
        },
    )
    run_job(cfg)
    out = read_output(tmp_path / "out")  # a pyarrow dataset over every part: one schema
    assert out.schema.field("price").type == pa.float64()
    assert dict(zip(out["id"].to_pylist(), out["price"].to_pylist(), strict=True)) == {
        0: 10.0, 1: 11.0, 2: 10.5, 10: 7.0, 11: 7.25, 20: 5.0
    }  # fmt: skip
    assert not (tmp_path / "out" / "_errors").exists()
    job = json.loads((tmp_path / "out" / "_bulkinfer" / "job.json").read_text())
    assert job["column_types"] == {"id": "int64", "x1": "int64", "price": "double"}


def test_declared_column_types_win_and_a_value_that_does_not_fit_fails_its_row(tmp_path, flaky):
    (tmp_path / "in.csv").write_text("id,x1,zip\n0,1,00501\n1,2,10001\n2,oops,10002\n3,3,\n")
    cfg = _cfg(
        tmp_path,
        **{
            "source.paths": [str(tmp_path / "in.csv")],
            "sink.keep_columns": ["zip"],
            "source.column_types": {"zip": "string", "x1": "double"},
            "execution.max_error_rate": 1.0,
        },
    )
    run_job(cfg)
    out = read_output(tmp_path / "out")
    assert out["zip"].to_pylist() == ["00501", "10001", None]  # leading zeros kept; empty is null
    assert out["y"].to_pylist() == [10.0, 20.0, 30.0]
    (err,) = _errors(tmp_path / "out")
    assert (err["row"], err["stage"]) == (2, "read")
    assert err["message"] == (
        "column 'x1': 'oops' is not double (the column's type in this job; fix the value or set source.column_types)"
    )
    with pytest.raises(Exception, match=r"source.column_types.*zip: unknown type 'text'"):
        _cfg(tmp_path, **{"source.column_types": {"zip": "text"}})


def test_with_the_defaults_one_bad_line_never_fails_a_small_job_but_a_wholesale_failure_does(tmp_path):
    """The issue's case: a 50-row JSONL with one invalid line, every setting at its default."""
    from helpers import cli

    lines = [json.dumps({"id": i, "x": i}) for i in range(50)]
    lines[17] = '{"id": 17, "x": '  # cut short
    (tmp_path / "small.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "m.py").write_text("def double(t):\n    return {'y': [2 * v for v in t['x'].to_pylist()]}\n")
    proc = cli("run", "-i", "small.jsonl", "-m", "m:double", "--feature-columns", "x", "--id-column", "id",
               "-o", "out", "--progress", "none", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == [i for i in range(50) if i != 17]
    errors = [
        json.loads(x) for f in (tmp_path / "out" / "_errors").glob("part-*.jsonl") for x in f.read_text().splitlines()
    ]
    assert [e["row"] for e in errors] == [17]
    # every row failing is not "one bad row": the floor is at most half the rows
    (tmp_path / "bad.py").write_text("def boom(t):\n    raise ValueError('no model here')\n")
    proc = cli("run", "-i", "small.jsonl", "-m", "bad:boom", "--feature-columns", "x", "--id-column", "id",
               "-o", "out2", "--progress", "none", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert (
        "over the error budget of 10 (execution.max_error_rate=0.001 of 50 rows, at least min_error_budget=10"
        in proc.stderr
    )


@pytest.mark.parametrize(
    ("rows", "rate", "floor", "cap", "budget"),
    [(50, 0.001, 10, None, 10), (5, 0.001, 10, None, 2), (1, 0.001, 10, None, 0), (100_000, 0.001, 10, None, 100),
     (50, 0.0, 10, None, 0), (50, 0.001, 10, 3, 3), (50, 0.5, 0, None, 25)],
)  # fmt: skip
def test_the_error_budget_rule(rows, rate, floor, cap, budget):
    from bulkinfer.config.execution import error_budget

    cfg = load_config(overrides={"execution.max_error_rate": rate, "execution.min_error_budget": floor,
                                 "execution.max_errors": cap})  # fmt: skip
    assert error_budget(cfg.execution, rows) == budget


def test_inputs_that_are_all_unreadable_are_named_each_with_why(tmp_path):
    """Not the column's fault: each unreadable file named with its reason; an empty file is no error."""
    from helpers import cli

    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    good = tmp_path / "good.parquet"
    write(pa.table({"description": ["a", "b"]}), good)
    (tmp_path / "cut.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "m.py").write_text("def n(t):\n    return {'n': [len(x) for x in t['description'].to_pylist()]}\n")
    base = ["-m", "m:n", "--feature-columns", "description", "--progress", "none"]
    proc = cli("run", "-i", "broken.parquet", "-i", "cut.parquet", *base, "-o", "o1", cwd=tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bulkinfer: error: none of the 2 input files could be read: ")
    assert f"{tmp_path}/broken.parquet: not a readable Parquet file" in last
    assert f"{tmp_path}/cut.parquet: not a readable Parquet file" in last and "column" not in last
    proc = cli("run", "-i", "broken.parquet", *base, "-o", "o2", cwd=tmp_path)
    assert proc.returncode == 1 and f"error: {tmp_path}/broken.parquet: not a readable Parquet file" in proc.stderr
    proc = cli("run", "-i", "empty.parquet", *base, "-o", "o3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done: 0 rows written" in proc.stdout
    proc = cli("run", "-i", "good.parquet", "-i", "broken.parquet", *base, "-o", "o4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # the bad file is a record in _errors/inputs.jsonl
    assert "broken.parquet" in (tmp_path / "o4" / "_errors" / "inputs.jsonl").read_text()


def _text_lengths(tmp_path, name: str) -> pa.Table:
    """Run a model that measures each row's ``text`` over ``name``; its output, by id."""
    from helpers import cli

    (tmp_path / "m.py").write_text("def n(t):\n    return {'n': [len(x) for x in t['text'].to_pylist()]}\n")
    proc = cli("run", "-i", name, "-m", "m:n", "--feature-columns", "text", "--id-column", "id",
               "-o", "out", "--progress", "none", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return read_output(tmp_path / "out").sort_by("id")


def test_a_jsonl_whose_first_record_is_longer_than_the_sampling_window_is_read(tmp_path):
    """A 1.5 MB first document (ordinary for long-text jobs) left the head sample with no whole
    record; the job used to stop with "no readable columns"."""
    lines = [json.dumps({"id": 0, "text": "word " * 300_000})] + [
        json.dumps({"id": i, "text": f"short text {i}"}) for i in range(1, 20)
    ]
    (tmp_path / "long.jsonl").write_text("\n".join(lines) + "\n")
    out = _text_lengths(tmp_path, "long.jsonl")
    assert out["id"].to_pylist() == list(range(20)) and out["n"][0].as_py() == 1_500_000


def test_a_csv_whose_first_value_is_a_huge_quoted_field_with_line_breaks_is_read(tmp_path):
    """One quoted value of 2.25 MB holding line breaks: longer than any parse block, it used
    to fail every row of the file ("straddles two block boundaries")."""
    import csv

    with open(tmp_path / "big.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "text"])
        w.writerow([0, 'word, "quoted"\n' * 150_000])
        for i in range(1, 20):
            w.writerow([i, f"short {i}"])
    out = _text_lengths(tmp_path, "big.csv")
    assert out["id"].to_pylist() == list(range(20)) and out["n"][0].as_py() == 2_250_000
    assert out["n"][5].as_py() == len("short 5")
