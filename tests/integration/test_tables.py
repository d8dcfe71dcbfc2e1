"""Delta Lake and Iceberg tables as sources: the chosen snapshot's rows exactly, the snapshot
pinned by the job's fingerprint, and the cases bulkinfer refuses rather than read wrong."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from bulkinfer import run_job
from bulkinfer.core.errors import Interrupted, JobMismatchError, SourceError

from helpers import job_config, read_output, stop_after_commits, tabular_table, train_classifier


def cfg_for(tmp_path, out, **extra):
    return job_config(
        tmp_path / out, [], **{"model.name": str(tmp_path / "m.joblib"), "source.shard_rows": 100, **extra}
    )


def ids(out):
    return sorted(read_output(out)["id"].to_pylist())


def test_delta_versions_time_travel_and_a_pinned_snapshot(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    train_classifier(tmp_path / "m.joblib")
    table = str(tmp_path / "items")
    write_deltalake(table, tabular_table(300, seed=1))
    time.sleep(0.05)
    between = datetime.now(UTC).isoformat()
    time.sleep(0.05)
    write_deltalake(table, tabular_table(200, seed=2, start=300), mode="append")
    delta = {"source.paths": [table], "source.format": "delta"}
    assert ids(run_job(cfg_for(tmp_path, "v0", **delta, **{"source.version": 0})).output) == list(range(300))
    assert ids(run_job(cfg_for(tmp_path, "then", **delta, **{"source.as_of": between})).output) == list(range(300))
    latest = run_job(cfg_for(tmp_path, "latest", **delta))
    assert ids(latest.output) == list(range(500)) and latest.report["rows_out"] == 500

    # stopped, then the table moves on: a resume at "latest" would mix snapshots, so it is refused
    stop = stop_after_commits(tmp_path / "moving", 1)
    moving = cfg_for(tmp_path, "moving", **delta, **{"runtime.batch_size": 8})
    with pytest.raises(Interrupted):
        run_job(moving, stop=stop)
    write_deltalake(table, tabular_table(50, seed=3, start=500), mode="append")
    with pytest.raises(JobMismatchError):
        run_job(moving)
    pinned = cfg_for(tmp_path, "moving", **delta, **{"source.version": 1, "execution.overwrite": True})
    run_job(pinned)
    assert ids(tmp_path / "moving") == list(range(500)) and DeltaTable(table).version() == 2


def test_delta_refusals(tmp_path):
    from deltalake import write_deltalake

    train_classifier(tmp_path / "m.joblib")
    t = tabular_table(100, seed=1)
    write_deltalake(str(tmp_path / "by_x3"), t, partition_by=["x3"])
    with pytest.raises(SourceError, match="'x3' is a partition column of the Delta table"):
        run_job(cfg_for(tmp_path, "o1", **{"source.paths": [str(tmp_path / "by_x3")], "source.format": "delta"}))
    (tmp_path / "plain").mkdir()
    with pytest.raises(SourceError, match="not a Delta table"):
        run_job(cfg_for(tmp_path, "o2", **{"source.paths": [str(tmp_path / "plain")], "source.format": "delta"}))


def test_iceberg_snapshots(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    train_classifier(tmp_path / "m.joblib")
    props = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    catalog = SqlCatalog("shop", **props)
    catalog.create_namespace("shop")
    first_rows = tabular_table(250, seed=1)
    table = catalog.create_table("shop.items", schema=first_rows.schema)
    table.append(first_rows)
    first = table.current_snapshot().snapshot_id
    table.append(tabular_table(120, seed=2, start=250))
    ice = {"source.paths": ["shop.items"], "source.format": "iceberg", "source.catalog": {"name": "shop",
           "type": "sql", **props}}  # fmt: skip
    assert ids(run_job(cfg_for(tmp_path, "first", **ice, **{"source.snapshot_id": first})).output) == list(range(250))
    current = run_job(cfg_for(tmp_path, "current", **ice))
    assert ids(current.output) == list(range(370))
    expect = pa.concat_tables([first_rows, tabular_table(120, seed=2, start=250)])
    out = read_output(tmp_path / "current").sort_by("id")
    assert out.num_rows == expect.num_rows and current.report["rows_failed"] == 0
    with pytest.raises(SourceError, match="no such Iceberg table"):
        run_job(cfg_for(tmp_path, "none", **{**ice, "source.paths": ["shop.nothing"]}))
