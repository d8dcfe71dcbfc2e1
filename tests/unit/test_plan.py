"""make_plan: a resume takes the shards and types job.json holds without reading any input's
footer or head again; a changed input is planned afresh."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bulkinfer.plan as plan_module
from bulkinfer import load_config
from bulkinfer.adapters import build_adapter, resolve_model
from bulkinfer.core.errors import SourceError
from bulkinfer.core.records import ErrorRecord
from bulkinfer.plan import JobPlan, make_plan, plan_fields
from bulkinfer.sources import Shard

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


_shards = st.builds(
    Shard,
    index=st.integers(0, 10**7),
    uri=st.sampled_from(["/in/a.jsonl", "s3://b/k.csv", '/in/ü ,"q".parquet']),
    format=st.sampled_from(["jsonl", "csv", "parquet"]),
    start=st.integers(0, 10**9),
    stop=st.integers(0, 10**9),
    offset=st.none() | st.integers(0, 10**12),
    end=st.none() | st.integers(0, 10**12),
    base=st.none() | st.integers(0, 10**9),
    repeats=st.lists(st.integers(0, 99), max_size=3).map(tuple),
    oversized=st.booleans(),
    encoding=st.none() | st.just("utf-16-le"),
)


@settings(max_examples=60, deadline=None)
@given(shards=st.lists(_shards, max_size=20), errors=st.booleans())
def test_job_json_keeps_every_shard_one_a_line_and_its_fields_read_without_them(shards, errors):
    """job.json is written in chunks with its shards last, one a line: it is one JSON document,
    it reads back as the same plan, and its fields read without parsing a shard."""
    plan = JobPlan(
        fingerprint="f" * 32, identity={"source.id_column": "id"}, model_kind="custom", model_location="m:x",
        model_digest="d", inputs=[], config={"sink": {"path": "out"}}, shards=shards, column_types={"x": "double"},
        input_errors=[ErrorRecord.of("/in/a.jsonl", None, "plan", SourceError("bad"))] if errors else [],
    )  # fmt: skip
    text = "".join(plan.json_chunks())
    assert json.loads(text) == json.loads(json.dumps(plan.to_json()))  # tuples are lists in JSON
    back = JobPlan.from_lines(text.splitlines(keepends=True))
    assert back == plan and back.shards == shards
    assert plan_fields(text.encode()) == plan.to_json(shards=False)
    before = json.dumps(plan.to_json(), indent=1)  # the layout of earlier versions: one document, read whole
    assert JobPlan.from_lines(before.splitlines(keepends=True)) == plan
    assert plan_fields(before.encode()) == plan.to_json(shards=False)


def test_a_change_of_how_an_input_is_read_is_named_as_the_setting_not_the_input():
    from bulkinfer.plan import JobPlan, describe_change

    store = {"uri": "grid.zarr", "format": "zarr", "size": 10, "version": "1", "digest": "d"}
    old = JobPlan.from_json({"fingerprint": "a", "model_digest": "m", "identity": {"source.tile": {"y": 16}},
                             "inputs": [{**store, "encoding": '{"tile": {"y": 16}}'}]})  # fmt: skip
    retiled = JobPlan.from_json({"fingerprint": "b", "model_digest": "m", "identity": {"source.tile": {"y": 8}},
                                 "inputs": [{**store, "encoding": '{"tile": {"y": 8}}'}]})  # fmt: skip
    assert describe_change(old, retiled) == "config changed: source.tile"
    rewritten = JobPlan.from_json({"fingerprint": "c", "model_digest": "m", "identity": {"source.tile": {"y": 8}},
                                   "inputs": [{**store, "digest": "e", "encoding": '{"tile": {"y": 8}}'}]})  # fmt: skip
    assert describe_change(old, rewritten) == "input grid.zarr changed"  # the store's files changed too
