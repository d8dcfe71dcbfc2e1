"""A rerun that finds every shard committed does not replace the last run's figures with its
zeros (issue 54 item 9): report.json keeps them, says the job's totals over every run and that
the latest run did nothing; every run keeps its own entry under runs/."""

from __future__ import annotations

import json

from bulkinfer import run_job

from helpers import cli, job_config, tabular_table, train_classifier, write


def test_a_rerun_that_did_nothing_keeps_the_runs_figures_and_counts_itself(tmp_path):
    model = train_classifier(tmp_path / "m.joblib")
    write(tabular_table(300), tmp_path / "in.parquet")
    cfg = job_config(tmp_path / "out", [tmp_path / "in.parquet"],
                     **{"model.name": str(model), "model.feature_columns": ["x1", "x2", "x3"], "source.shard_rows": 100})  # fmt: skip
    first = run_job(cfg).report
    again = run_job(cfg).report
    on_disk = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())
    assert on_disk == again
    assert again["rows_out"] == first["rows_out"] == 300 and again["rows_per_s"] == first["rows_per_s"] > 0
    assert again["latest_run"]["did_nothing"] and again["latest_run"]["rows_out"] == 0
    assert again["latest_run"]["rows_already_done"] == 300
    assert again["job"]["runs"] == 2 and again["job"]["rows_out"] == 300
    # the no-op's own seconds are added (a fast machine's no-op may round to 0.000: the sum, not a growth, is checked)
    assert again["job"]["wall_s"] == round(first["wall_s"] + again["latest_run"]["wall_s"], 3)
    assert first["job"] == {**first["job"], "runs": 1, "rows_out": 300}
    assert len(list((tmp_path / "out" / "_bulkinfer" / "runs").glob("*.json"))) == 2
    shown = json.loads(cli("inspect", "out", "--json", cwd=tmp_path, check=True).stdout)
    assert shown["last_run"]["rows_out"] == 300
