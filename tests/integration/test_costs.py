"""Cost by label: each run's entry under _bulkinfer/runs/, the instance price table, the
labels in metrics, and ``bulkinfer costs`` summing runs by month and label."""

from __future__ import annotations

import csv
import io
import json

import pytest

from bulkinfer import load_config, run_job
from bulkinfer.core.errors import ConfigError, Interrupted
from bulkinfer.report.publish import price_table

from helpers import cli, stop_after_commits, tabular_table, train_classifier, write


def job(tmp_path, out, **extra):
    return load_config(overrides={
        "source.paths": [str(tmp_path / "in.parquet")], "model.name": str(tmp_path / "m.joblib"),
        "source.id_column": "id", "sink.path": str(tmp_path / out), "source.shard_rows": 200,
        "execution.progress": "none", **extra,
    })  # fmt: skip


def entries(out):
    return [json.loads(p.read_text()) for p in sorted((out / "_bulkinfer" / "runs").glob("*.json"))]


def test_runs_are_booked_by_month_and_label(tmp_path):
    train_classifier(tmp_path / "m.joblib")
    write(tabular_table(2000, seed=1), tmp_path / "in.parquet")
    search = {"cost.labels": {"team": "search", "model": "rf-v3"}}
    run_job(job(tmp_path, "a", **search, **{"cost.instance": "c7i.large"}))
    run_job(job(tmp_path, "b", **{"cost.labels": {"team": "risk", "model": "rf-v3"},
                                  "cost.instance_price_per_hour": 3.6}))  # fmt: skip
    # a run stopped part-way, then resumed: both runs were paid for
    stop = stop_after_commits(tmp_path / "c", 2)
    stopped = job(tmp_path, "c", **search, **{"cost.instance_price_per_hour": 7.2, "runtime.batch_size": 8})
    with pytest.raises(Interrupted):
        run_job(stopped, stop=stop)
    run_job(stopped)

    a, b, c = entries(tmp_path / "a"), entries(tmp_path / "b"), entries(tmp_path / "c")
    assert (len(a), len(b), len(c)) == (1, 1, 2) and [e["status"] for e in c] == ["interrupted", "complete"]
    assert a[0]["price_per_hour"] == price_table()["aws"]["c7i.large"] == 0.08925
    assert a[0]["cost"] == pytest.approx(0.08925 * a[0]["wall_s"] / 3600, rel=1e-3, abs=1e-9)
    report = json.loads((tmp_path / "a" / "_bulkinfer" / "report.json").read_text())
    assert report["cost"]["labels"] == {"team": "search", "model": "rf-v3"}
    assert report["cost"]["price_source"] == "price table (aws on-demand)"
    prom = (tmp_path / "a" / "_bulkinfer" / "metrics.prom").read_text()
    assert 'model="rf-v3"' in prom and 'team="search"' in prom

    # an earlier month's run of "c" (as if it ran in November)
    runs = sorted((tmp_path / "c" / "_bulkinfer" / "runs").glob("*.json"))
    old = json.loads(runs[0].read_text())
    old["started_at"] = "2026-11-30T23:59:00Z"
    runs[0].write_text(json.dumps(old))

    proc = cli("costs", str(tmp_path / "[abc]"), "--format", "json", check=True)
    rows = {(r["month"], r["team"], r["model"]): r for r in json.loads(proc.stdout)}
    month = a[0]["started_at"][:7]
    assert set(rows) == {("2026-11", "search", "rf-v3"), (month, "search", "rf-v3"), (month, "risk", "rf-v3")}
    now = rows[(month, "search", "rf-v3")]
    assert now["runs"] == 2 and now["outputs"] == 2 and now["rows"] == a[0]["rows_out"] + c[1]["rows_out"]
    assert now["cost"] == pytest.approx(a[0]["cost"] + c[1]["cost"], abs=1e-6)
    assert rows[("2026-11", "search", "rf-v3")]["cost"] == pytest.approx(c[0]["cost"], abs=1e-6)
    assert rows[(month, "risk", "rf-v3")]["rows"] == 2000

    by_team = cli("costs", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"), "--by", "team",
                  "--format", "csv", check=True)  # fmt: skip
    table = list(csv.DictReader(io.StringIO(by_team.stdout)))
    assert {(r["month"], r["team"]) for r in table} == {("2026-11", "search"), (month, "search"), (month, "risk")}
    assert "model" not in table[0]
    text = cli("costs", str(tmp_path / "a"), check=True).stdout
    assert "search" in text and text.strip().splitlines()[-1].startswith("total ")


def test_an_unknown_instance_is_one_line_before_any_work(tmp_path):
    train_classifier(tmp_path / "m.joblib")
    write(tabular_table(50, seed=1), tmp_path / "in.parquet")
    with pytest.raises(ConfigError, match="cost.instance: 'c9z.huge' is not in bulkinfer's price table"):
        run_job(job(tmp_path, "out", **{"cost.instance": "c9z.huge"}))
    assert not (tmp_path / "out").exists()
    missing = cli("costs", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "not a bulkinfer output" in missing.stderr
