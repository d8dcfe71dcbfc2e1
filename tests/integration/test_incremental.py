"""Incremental runs and dedupe: results taken from the previous output (or from an earlier
identical row) equal a full run's, exactly; only changed and new rows reach the model; ids
that disappeared are listed; a killed incremental run resumes exactly once."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkinfer import run_job
from bulkinfer.core.errors import ConfigError, Interrupted

from helpers import cli, job_config, read_output, stop_after_commits, tabular_table, write

MODELS = textwrap.dedent("""
    import os
    import time
    import numpy as np
    from bulkinfer import Adapter

    class Scored(Adapter):
        input_columns = ("x1", "x2", "segment")

        def __init__(self, scale=1.0):
            self.scale = scale

        def predict(self, batch):
            log = os.environ.get("CALLS_LOG")  # every row the model sees, counted
            if log:
                with open(log, "a") as fh:
                    fh.write(f"{batch.num_rows}\\n")
            time.sleep(float(os.environ.get("SLOW_S", "0")))
            x1, x2 = batch["x1"].to_numpy(), batch["x2"].to_numpy()
            seg = np.array([len(s) for s in batch["segment"].to_pylist()], float)
            emb = np.column_stack([x1, x2, seg, x1 * x2]) * self.scale
            return {"embedding": emb.astype(np.float32), "score": self.scale * (x1 + 2 * x2) + seg,
                    "label": np.where(x1 > 0, "up", "down")}

    class Picky(Scored):
        def predict(self, batch):
            if (batch["x1"].to_numpy() > 1.5).any():
                raise ValueError("x1 over 1.5")
            return super().predict(batch)
""")


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "incmodels.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "incmodels:Scored"
    sys.modules.pop("incmodels", None)


def config(tmp_path, inp, out, **extra):
    return job_config(tmp_path / out, [tmp_path / inp], **{
        "model.name": "incmodels:Scored", "source.shard_rows": 150, "runtime.batch_size": 32, **extra,
    })  # fmt: skip


def calls(path) -> int:
    return sum(int(x) for x in path.read_text().split()) if path.exists() else 0


@pytest.fixture
def nightly(tmp_path, models):
    """Yesterday's catalog and output (with input hashes); today's catalog: 50 rows changed,
    10 deleted, 20 new, and the rows shuffled."""
    old = tabular_table(1000, seed=11)
    write(old, tmp_path / "old.parquet")
    run_job(config(tmp_path, "old.parquet", "prev", **{"sink.input_hash": True}))
    rng = np.random.default_rng(5)
    x1 = old["x1"].to_numpy().copy()
    changed = rng.choice(1000, 50, replace=False)
    x1[changed] += 1.0
    new = old.set_column(1, "x1", [x1])
    deleted = rng.choice(np.setdiff1d(np.arange(1000), changed), 10, replace=False)
    new = new.filter(pa.array(~np.isin(np.arange(1000), deleted)))
    new = pa.concat_tables([new, tabular_table(20, seed=12, start=5000)])
    new = new.take(pa.array(rng.permutation(new.num_rows)))
    write(new, tmp_path / "new.parquet")
    return {"changed": set(changed.tolist()), "deleted": set(deleted.tolist()), "rows": new.num_rows}


def test_an_incremental_run_equals_a_full_run_and_infers_only_what_changed(tmp_path, nightly, monkeypatch):
    full = run_job(config(tmp_path, "new.parquet", "full", **{"sink.input_hash": True}))
    log = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS_LOG", str(log))
    inc = run_job(config(tmp_path, "new.parquet", "inc", **{"source.previous": str(tmp_path / "prev")}))
    monkeypatch.delenv("CALLS_LOG")
    a, b = read_output(tmp_path / "full").sort_by("id"), read_output(tmp_path / "inc").sort_by("id")
    assert b.num_rows == nightly["rows"] == 1010 and a.equals(b)  # same ids, same values, same hashes
    assert b.column_names == ["id", "embedding", "score", "label", "_input_hash"]
    reuse = inc.report["reuse"]
    assert reuse["rows_from_previous"] == 1000 - 50 - 10 and reuse["rows_inferred"] == 70
    assert calls(log) == 70 and full.report["reuse"]["rows_from_previous"] == 0
    deleted = pq.read_table(tmp_path / "inc" / "_deleted.parquet")
    assert set(deleted["id"].to_pylist()) == nightly["deleted"]
    manifest = json.loads((tmp_path / "inc" / "_SUCCESS").read_text())
    assert manifest["deleted"] == {"file": "_deleted.parquet", "rows": 10}

    # delta mode: only the changed and new rows, and the deletions
    run_job(config(tmp_path, "new.parquet", "delta", **{"source.previous": str(tmp_path / "prev"),
                                                         "sink.mode": "delta"}))  # fmt: skip
    d = read_output(tmp_path / "delta")
    assert set(d["id"].to_pylist()) == nightly["changed"] | set(range(5000, 5020))
    assert d.sort_by("id").equals(a.filter(pa.compute.is_in(a["id"], d["id"])).sort_by("id"))
    assert set(pq.read_table(tmp_path / "delta" / "_deleted.parquet")["id"].to_pylist()) == nightly["deleted"]


def test_nothing_is_reused_when_the_model_or_a_setting_changed(tmp_path, nightly, caplog):
    inc = run_job(config(tmp_path, "new.parquet", "inc", **{"source.previous": str(tmp_path / "prev"),
                                                             "model.options": {"scale": 2.0}}))  # fmt: skip
    assert inc.report["reuse"]["rows_from_previous"] == 0 and inc.report["reuse"]["rows_inferred"] == 1010
    assert "nothing can be reused" in caplog.text and "model.options changed" in caplog.text
    full = run_job(config(tmp_path, "new.parquet", "full", **{"model.options": {"scale": 2.0},
                                                               "sink.input_hash": True}))  # fmt: skip
    assert read_output(tmp_path / "inc").sort_by("id").equals(read_output(tmp_path / "full").sort_by("id"))
    assert full.report["rows_out"] == 1010


def test_refusals_name_the_reason(tmp_path, models):
    write(tabular_table(100, seed=1), tmp_path / "in.parquet")
    run_job(config(tmp_path, "in.parquet", "plain", **{"sink.input_hash": False}))
    with pytest.raises(
        ConfigError, match=r"written without input hashes \(sink.input_hash = false, or by an older bulkinfer"
    ):
        run_job(config(tmp_path, "in.parquet", "x", **{"source.previous": str(tmp_path / "plain")}))
    with pytest.raises(ConfigError, match="needs source.id_column"):
        run_job(config(tmp_path, "in.parquet", "y", **{"source.previous": str(tmp_path / "plain"),
                                                        "source.id_column": None}))  # fmt: skip
    with pytest.raises(ConfigError, match="no _SUCCESS"):
        run_job(config(tmp_path, "in.parquet", "z", **{"source.previous": str(tmp_path / "nowhere")}))


def test_any_parquet_output_with_ids_can_serve_the_next_night_and_a_resume_keeps_its_first_choice(
    tmp_path, models, monkeypatch
):
    """Input hashes are on by default for a Parquet output with an id column, so the first
    incremental night works from a plain run; an output begun without them (an older
    bulkinfer's default) resumes without them rather than as a changed job."""
    write(tabular_table(600, seed=1), tmp_path / "in.parquet")
    run_job(config(tmp_path, "in.parquet", "plain"))
    assert read_output(tmp_path / "plain").column_names[-1] == "_input_hash"
    result = run_job(config(tmp_path, "in.parquet", "inc", **{"source.previous": str(tmp_path / "plain")}))
    assert result.report["reuse"]["rows_from_previous"] == 600
    no_ids = run_job(config(tmp_path, "in.parquet", "no_ids", **{"source.id_column": None}))
    assert "_input_hash" not in read_output(no_ids.output).column_names
    begun = config(tmp_path, "in.parquet", "old", **{"sink.input_hash": False})
    monkeypatch.setenv("SLOW_S", "0.05")  # 19 batches: the stop comes long before the last
    with pytest.raises(Interrupted):
        run_job(begun, stop=stop_after_commits(tmp_path / "old", 1))
    monkeypatch.delenv("SLOW_S")
    assert 0 < len(list((tmp_path / "old").glob("part-*.parquet"))) < 4
    resumed = run_job(config(tmp_path, "in.parquet", "old"))  # input_hash unset, as an upgraded version runs it
    assert resumed.report["rows_already_done"] >= 150 and resumed.report["status"] == "complete"
    for part in (tmp_path / "old").glob("part-*.parquet"):
        assert "_input_hash" not in pq.read_schema(part).names
    redone = run_job(config(tmp_path, "in.parquet", "old", **{"execution.overwrite": True}))
    assert redone.report["rows_already_done"] == 0 and read_output(tmp_path / "old").column_names[-1] == "_input_hash"


def test_a_killed_incremental_run_resumes_exactly_once(tmp_path, nightly):
    args = ["run", "-i", str(tmp_path / "new.parquet"), "-m", "incmodels:Scored", "--id-column", "id",
            "-o", str(tmp_path / "inc"), "--shard-rows", "150", "--progress", "none",
            "--incremental-from", str(tmp_path / "prev")]  # fmt: skip
    env = {**os.environ, "BULKINFER_CRASH_AT": "exported:3", "PYTHONPATH": str(tmp_path)}
    assert cli(*args, env=env).returncode == -9
    env.pop("BULKINFER_CRASH_AT")
    cli(*args, env=env, check=True)
    run_job(config(tmp_path, "new.parquet", "full", **{"sink.input_hash": True}))
    out = read_output(tmp_path / "inc").sort_by("id")
    assert out.num_rows == 1010 and len(set(out["id"].to_pylist())) == 1010
    assert out.equals(read_output(tmp_path / "full").sort_by("id"))


def test_dedupe_computes_each_distinct_input_once_with_identical_output(tmp_path, models, monkeypatch):
    base = tabular_table(600, seed=3)
    rng = np.random.default_rng(1)
    src = rng.integers(0, 600, 400)  # 400 more rows copying earlier rows' inputs (new ids)
    dup = base.take(pa.array(src)).set_column(0, "id", [np.arange(1000, 1400)])
    table = pa.concat_tables([base, dup])
    table = table.take(pa.array(rng.permutation(1000)))
    write(table, tmp_path / "in.parquet")
    off = run_job(config(tmp_path, "in.parquet", "off"))
    log = tmp_path / "calls.txt"
    monkeypatch.setenv("CALLS_LOG", str(log))
    on = run_job(config(tmp_path, "in.parquet", "on", **{"runtime.dedupe": "true"}))
    monkeypatch.delenv("CALLS_LOG")
    assert read_output(tmp_path / "on").sort_by("id").equals(read_output(tmp_path / "off").sort_by("id"))
    distinct = len(set(zip(table["x1"].to_pylist(), table["x2"].to_pylist(), table["segment"].to_pylist(),
                           strict=True)))  # fmt: skip
    assert calls(log) == distinct and on.report["reuse"]["rows_deduplicated"] == 1000 - distinct
    assert off.report["reuse"]["rows_deduplicated"] == 0
    auto = run_job(config(tmp_path, "in.parquet", "auto", **{"runtime.dedupe": "auto"}))
    assert auto.report["reuse"]["dedupe"] is True and auto.report["reuse"]["rows_deduplicated"] > 0


def test_dedupe_copies_a_failure_to_the_rows_that_repeat_its_input(tmp_path, models):
    base = tabular_table(400, seed=4)
    dup = base.take(pa.array(np.arange(0, 400, 2))).set_column(0, "id", [np.arange(1000, 1200)])
    table = pa.concat_tables([base, dup])  # every other row again, in later shards
    write(table, tmp_path / "in.parquet")
    picky = {"model.name": "incmodels:Picky", "execution.max_error_rate": 0.5}
    off = run_job(config(tmp_path, "in.parquet", "off", **picky))
    on = run_job(config(tmp_path, "in.parquet", "on", **picky, **{"runtime.dedupe": True}))
    assert read_output(tmp_path / "on").sort_by("id").equals(read_output(tmp_path / "off").sort_by("id"))
    x1 = table["x1"].to_numpy()
    bad = set(np.asarray(table["id"])[x1 > 1.5].tolist())
    assert on.report["rows_failed"] == off.report["rows_failed"] == len(bad) > 0
    records = "".join(p.read_text() for p in (tmp_path / "on" / "_errors").glob("*.jsonl"))
    assert records.count("same input as an earlier row") == len([i for i in bad if i >= 1000])
    assert on.report["reuse"]["rows_deduplicated"] == 200
