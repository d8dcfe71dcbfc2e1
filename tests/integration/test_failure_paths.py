"""On every failure path no part is visible without its commit (a reader that skips ``_``
and ``.`` names sees only committed files): a failure injected at each stage of a run, in a
real run, then the folder listed against the ledger."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer import BulkinferError, run_job
from bulkinfer.commit.ledger import Ledger
from bulkinfer.core.errors import OutputError

from helpers import job_config, write

MODEL = """
import numpy as np


def score(table):
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float64)
    if (x < 0).any():
        raise ValueError("negative x")
    return {"y": x * 2}
"""


def visible_parts(out) -> set[str]:
    return {p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(("_", "."))}


def committed(out) -> set[str]:
    return {c.file for c in Ledger(out).commits() if c.file}


@pytest.fixture
def job(tmp_path, monkeypatch):
    (tmp_path / "failmodel.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    x = np.arange(300, dtype=np.float64)
    x[[140, 150, 160, 170, 260]] = -1  # five bad rows in shards 1 and 2
    write(pa.table({"id": np.arange(300), "x": x}), tmp_path / "in.parquet")

    def cfg(**overrides):
        base = {"source.shard_rows": 100, "model.name": "failmodel:score", "model.feature_columns": ["x"],
                "export": [{"kind": "folder", "path": "copy"}]}  # fmt: skip
        return job_config("out", ["in.parquet"], **{**base, **overrides})

    return cfg, tmp_path / "out"


def _fail_on_second_write(monkeypatch, exc: BaseException) -> None:
    from bulkinfer.sinks.folder import FolderTarget

    real, calls = FolderTarget.write, []

    def write_then_fail(self, part, table):
        calls.append(part)
        if len(calls) == 2:
            raise exc
        return real(self, part, table)

    monkeypatch.setattr(FolderTarget, "write", write_then_fail)


@pytest.mark.parametrize(
    "stage",
    ["export refused", "stopped during an export", "error budget exceeded", "ledger line refused", "no error allowed"],
)
def test_no_part_is_visible_without_its_commit_whatever_fails(job, monkeypatch, stage):
    cfg, out = job
    if stage == "export refused":
        _fail_on_second_write(monkeypatch, OutputError("copy: the target refused the rows"))
    elif stage == "stopped during an export":
        _fail_on_second_write(monkeypatch, KeyboardInterrupt())
    elif stage == "ledger line refused":
        from bulkinfer.core.errors import LedgerError

        real, calls = Ledger.commit_many, []

        def commit_then_fail(self, records):  # every ledger append goes through commit_many
            calls.append(records)
            if len(calls) == 2:
                raise LedgerError("commits.log: disk full")
            return real(self, records)

        monkeypatch.setattr(Ledger, "commit_many", commit_then_fail)
    settings = {
        "error budget exceeded": {"execution.max_errors": 2},
        "no error allowed": {"execution.max_error_rate": 0.0, "execution.min_error_budget": 0},
    }.get(stage, {})
    with pytest.raises((BulkinferError, KeyboardInterrupt)):
        run_job(cfg(**settings))
    parts = visible_parts(out)
    assert parts <= committed(out), f"{stage}: visible without a commit: {sorted(parts - committed(out))}"
    assert not (out / "_SUCCESS").exists()
    assert parts == committed(out) and "part-00000.parquet" in parts  # the first shard was committed and stays
    # the rerun (the cause removed) completes every good row exactly once (a duplicate would show in the list)
    monkeypatch.undo()
    monkeypatch.chdir(out.parent)
    monkeypatch.syspath_prepend(str(out.parent))
    result = run_job(cfg(**{"execution.max_error_rate": 0.5}))
    assert result.status == "complete" and (out / "_SUCCESS").exists()
    table = pa.concat_tables(pa.parquet.read_table(out / p) for p in sorted(visible_parts(out)))
    assert sorted(table["id"].to_pylist()) == sorted(set(range(300)) - {140, 150, 160, 170, 260})
