"""The Grafana dashboards of a bulkinfer run and of ``bulkinfer serve``, built with grafanalib
(never hand-edited JSON).

    python examples/monitoring/dashboards.py          # writes job-dashboard.json, server-dashboard.json
    python examples/monitoring/dashboards.py --check  # exit 1 when a committed JSON differs

Every panel's PromQL is run by the test suite against a real Prometheus that scraped a real
run or server (tests/integration/test_run_metrics.py), and must return series. Import the JSON
in Grafana with a Prometheus data source named by the ``DS_PROMETHEUS`` input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard, DataSourceInput, GridPos, Stat, Target, Template, Templating, TimeSeries

HERE = Path(__file__).resolve().parent
DS = "${DS_PROMETHEUS}"
JOB = 'bulkinfer_job=~"$job"'
SERVER = 'instance=~"$instance"'

RUN_PANELS = [
    # (title, kind, PromQL, unit)
    ("Rows done", "stat", f"sum by (bulkinfer_job) (bulkinfer_job_rows_done{{{JOB}}})", "short"),
    ("Rows planned", "stat", f"sum by (bulkinfer_job) (bulkinfer_job_rows_planned{{{JOB}}})", "short"),
    ("Done", "stat", f"bulkinfer_job_rows_done{{{JOB}}} / bulkinfer_job_rows_planned{{{JOB}}}", "percentunit"),
    ("ETA", "stat", f"bulkinfer_job_eta_seconds{{{JOB}}}", "s"),
    ("Rows per second (inferred)", "timeseries", f"bulkinfer_job_rows_per_second{{{JOB}}}", "short"),
    ("Rows done over time", "timeseries", f"bulkinfer_job_rows_done{{{JOB}}}", "short"),
    ("Busy share per stage", "timeseries", f"bulkinfer_job_stage_busy_ratio{{{JOB}}}", "percentunit"),
    ("Error budget used", "timeseries", f"bulkinfer_job_error_budget_used_ratio{{{JOB}}}", "percentunit"),
    ("Seconds since the last commit", "timeseries",
     f"time() - bulkinfer_job_last_commit_timestamp_seconds{{{JOB}}}", "s"),
    ("Memory (max RSS)", "timeseries", f"bulkinfer_job_memory_max_rss_bytes{{{JOB}}}", "bytes"),
]  # fmt: skip

SERVER_PANELS = [
    ("Requests per second", "stat", f"sum(rate(bulkinfer_serve_requests_total{{{SERVER}}}[1m]))", "reqps"),
    ("Rows waiting", "stat", f"sum(bulkinfer_serve_queue_rows{{{SERVER}}})", "short"),
    ("Refused (503) per second", "stat", f"sum(rate(bulkinfer_serve_rejected_total{{{SERVER}}}[1m]))", "reqps"),
    ("Batch requests per second", "stat", f"sum(bulkinfer_batch_rows_per_second{{{SERVER}}})", "short"),
    ("Requests per second by route and status", "timeseries",
     f"sum by (endpoint, status) (rate(bulkinfer_serve_requests_total{{{SERVER}}}[1m]))", "reqps"),
    ("Latency p95 by route", "timeseries", "histogram_quantile(0.95, sum by (le, endpoint) "
     f"(rate(bulkinfer_serve_request_seconds_bucket{{{SERVER}}}[1m])))", "s"),
    ("Rows per model call", "timeseries", f"sum(rate(bulkinfer_serve_batch_rows_sum{{{SERVER}}}[1m])) "
     f"/ sum(rate(bulkinfer_serve_batch_rows_count{{{SERVER}}}[1m]))", "short"),
    ("Batches by status", "timeseries", f"sum by (status) (bulkinfer_batches{{{SERVER}}})", "short"),
]  # fmt: skip


def dashboard(title: str, uid: str, rows: list[tuple[str, str, str, str]], variable: Template) -> Dashboard:
    panels = []
    for i, (name, kind, expr, unit) in enumerate(rows):
        stat = kind == "stat"
        pos = GridPos(h=4 if stat else 8, w=6 if stat else 12, x=(i % 4) * 6 if stat else (i % 2) * 12, y=i * 4)
        target = Target(expr=expr, legendFormat="{{bulkinfer_job}} {{stage}}{{endpoint}} {{status}}", refId="A")
        common = {"title": name, "dataSource": DS, "targets": [target], "gridPos": pos}
        if stat:
            panels.append(Stat(**common, format=unit, reduceCalc="lastNotNull"))
        else:
            panels.append(TimeSeries(**common, unit=unit))
    source = DataSourceInput(name="DS_PROMETHEUS", label="Prometheus", pluginId="prometheus", pluginName="Prometheus")
    board = Dashboard(title=title, uid=uid, tags=["bulkinfer"], panels=panels, inputs=[source],
                      templating=Templating(list=[variable]), refresh="30s", timezone="utc")  # fmt: skip
    return board.auto_panel_ids()


def boards() -> dict[str, Dashboard]:
    """Each dashboard by the file it is written to."""
    job = Template(name="job", label="Job", dataSource=DS, includeAll=True, multi=True, default="$__all",
                   query="label_values(bulkinfer_job_rows_planned, bulkinfer_job)")  # fmt: skip
    instance = Template(name="instance", label="Server", dataSource=DS, includeAll=True, multi=True, default="$__all",
                        query="label_values(bulkinfer_serve_queue_rows, instance)")  # fmt: skip
    return {
        "job-dashboard.json": dashboard("bulkinfer: a run", "bulkinfer-job", RUN_PANELS, job),
        "server-dashboard.json": dashboard("bulkinfer: serve", "bulkinfer-serve", SERVER_PANELS, instance),
    }


def render(board: Dashboard) -> str:
    return json.dumps(board.to_json_data(), cls=DashboardEncoder, indent=1, sort_keys=True) + "\n"


def main() -> int:
    differ = 0
    for name, board in boards().items():
        made, out = render(board), HERE / name
        if "--check" in sys.argv:
            same = out.exists() and out.read_text() == made
            print(f"{out} {'matches' if same else 'differs from'} dashboards.py")
            differ += not same
        else:
            out.write_text(made)
            print(f"wrote {out}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
