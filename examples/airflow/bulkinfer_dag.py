"""A nightly embeddings DAG: bulkinfer embeds the day's catalog, then a downstream task reads the
run's report from XCom (rows, cost, where the output is) and records it.

``params`` (overridable per run with ``--conf``/the trigger form): the job file, the folder
each night's output goes under (``{{ ds }}`` is added in the operator's own template: Airflow
renders a template field once, so a ``{{ ds }}`` inside a param would reach the job unrendered,
and bulkinfer refuses it), and the file the summary goes to. A stopped run (exit 75: the worker
was drained, the task killed) is retried and resumes; a bad job file fails at once.
"""

from __future__ import annotations

import json

import pendulum
from airflow.sdk import DAG, task

from bulkinfer.airflow import BulkinferOperator

with DAG(
    dag_id="bulkinfer_nightly",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "job": "/opt/jobs/catalog.toml",
        "output": "s3://embeddings/catalog",
        "summary": "/opt/jobs/runs.jsonl",
    },
) as dag:
    embed = BulkinferOperator(
        task_id="embed",
        job="{{ params.job }}",
        overrides={"sink.path": "{{ params.output }}/{{ ds }}"},
        retries=3,
    )

    @task
    def record(report: dict, params: dict | None = None) -> int:
        """One line per run: what was written, and what it cost."""
        line = {
            "output": report["output"],
            "rows_out": report["rows_out"],
            "rows_already_done": report["rows_already_done"],
            "cost": report["cost"]["run"],
        }
        with open(params["summary"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        return int(report["rows_out"])

    record(embed.output)
