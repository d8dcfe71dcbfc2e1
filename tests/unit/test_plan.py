"""make_plan: a resume takes the shards and types job.json holds without reading any input's
footer or head again; a changed input is planned afresh."""

from __future__ import annotations

import pytest

import bulkinfer.plan as plan_module
from bulkinfer import load_config
from bulkinfer.adapters import build_adapter, resolve_model
from bulkinfer.plan import JobPlan, make_plan

from helpers import tabular_table, write


@pytest.fixture()
def job(tmp_path, monkeypatch):
    (tmp_path / "planmodel.py").write_text(
        "import pyarrow.compute as pc\n\ndef f(t):\n    return {'y': pc.multiply(t['x1'], 2)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for i in range(5):
        write(tabular_table(30, seed=i, start=30 * i), tmp_path / "in" / f"p{i}.parquet", row_group_size=10)
    cfg = load_config(overrides={
        "source.paths": [str(tmp_path / "in")], "model.name": "planmodel:f", "model.feature_columns": ["x1"],
        "source.id_column": "id", "sink.path": str(tmp_path / "out"), "source.shard_rows": 10,
    })  # fmt: skip
    model = resolve_model(cfg)
    heads: list[str] = []
    real = plan_module.head_schema
    monkeypatch.setattr(plan_module, "head_schema", lambda f: heads.append(f.uri) or real(f))
    return tmp_path, cfg, model, build_adapter(cfg, model), heads


def test_a_resume_reads_no_head_and_keeps_the_stored_plan(job):
    tmp_path, cfg, model, adapter, heads = job
    first = make_plan(cfg, model, adapter)
    assert len(heads) == 5 and len(first.shards) == 15 and first.column_types["x1"] == "double"
    stored = JobPlan.from_json(first.to_json())  # as job.json gives it back
    heads.clear()
    again = make_plan(cfg, model, adapter, stored)
    assert heads == []  # nothing but the fingerprints (list_inputs) was read
    assert again.shards == first.shards and again.column_types == first.column_types
    assert again.fingerprint == first.fingerprint

    write(tabular_table(40, seed=9, start=120), tmp_path / "in" / "p4.parquet", row_group_size=10)
    changed = make_plan(cfg, model, adapter, stored)
    assert len(heads) == 5 and changed.fingerprint != first.fingerprint
    assert changed.rows == 160  # planned afresh from the files as they are now
