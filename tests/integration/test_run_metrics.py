"""A run's Prometheus metrics: scraped at ``--metrics-port`` while it runs, pushed to a real
Pushgateway (Debian's ``prometheus-pushgateway``) at an interval and once at the end with the
run's exit status; and the shipped alert rules, tested by Debian's ``promtool``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bulkinfer.report.live import DOCS

from helpers import BULKINFER, write

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "examples" / "monitoring"
ROWS = 200
MODEL = textwrap.dedent("""
    import time
    import pyarrow.compute as pc

    def slow(table):
        time.sleep(0.01 * table.num_rows)
        return {"y": pc.multiply(table["x"], 2)}
""")


def _job(tmp_path: Path, model: str = MODEL) -> list[str]:
    (tmp_path / "metricsmodel.py").write_text(model)
    write(pa.table({"id": np.arange(ROWS), "x": np.arange(ROWS)}), tmp_path / "in.parquet")
    return ["run", "-i", "in.parquet", "-m", "metricsmodel:slow", "--feature-columns", "x", "--id-column", "id",
            "--shard-rows", "20", "--batch-size", "10", "-o", "out", "--progress", "none"]  # fmt: skip


def _samples(text: str) -> dict[tuple[str, str | None], float]:
    """Each sample by name (and stage, where it has one)."""
    return {(s.name, s.labels.get("stage")): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _start(tmp_path: Path, *args: str, model: str = MODEL) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([*BULKINFER, *_job(tmp_path, model), *args], cwd=tmp_path, env=env, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip


def test_a_run_serves_its_metrics_while_it_runs(tmp_path):
    proc = _start(tmp_path, "--metrics-port", "0")
    assert proc.stderr is not None
    for line in proc.stderr:
        if match := re.search(r"metrics at http://[^:]+:(\d+)/metrics", line):
            break
    else:
        raise AssertionError(f"no metrics line: exit {proc.wait()}")
    url = f"http://127.0.0.1:{match.group(1)}/metrics"
    deadline, mid = time.monotonic() + 120, None
    while mid is None:
        got = _samples(httpx.get(url, timeout=10).text)
        if 0 < got[("bulkinfer_job_rows_done", None)] < ROWS:
            mid = got
        assert time.monotonic() < deadline and proc.poll() is None, "the run ended before a scrape saw it mid-way"
        time.sleep(0.1)
    assert mid[("bulkinfer_job_rows_planned", None)] == ROWS and mid[("bulkinfer_job_shards_planned", None)] == 10
    assert mid[("bulkinfer_job_rows_per_second", None)] > 0 and mid[("bulkinfer_job_eta_seconds", None)] > 0
    assert mid[("bulkinfer_job_stage_busy_ratio", "infer")] > 0
    assert mid[("bulkinfer_job_cpu_seconds", None)] > 0 and mid[("bulkinfer_job_memory_max_rss_bytes", None)] > 50e6
    assert ("bulkinfer_job_exit_code", None) not in mid  # still running
    assert {name for name, _stage in mid} <= set(DOCS)  # every metric is documented (docs/observability.md)
    proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    with pytest.raises(httpx.TransportError):  # the scrape server ends with the run
        httpx.get(url, timeout=2)
    import json

    process = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())["process"]
    assert process["cpu_s"] > 0 and process["max_rss_bytes"] >= mid[("bulkinfer_job_memory_max_rss_bytes", None)]


def _prometheus_daemon(name: str, *args: str) -> tuple[subprocess.Popen, str]:
    """Debian's ``name`` (prometheus, prometheus-pushgateway) on a free loopback port, once it
    answers ``/-/ready``; (the process, its URL)."""
    binary = shutil.which(name)
    if binary is None:  # make test installs it (tools/system_deps.sh): missing is a failure, not a skip
        pytest.fail(f"{name} is missing: run make test (tools/system_deps.sh installs it)")
    from services import on_a_free_port

    started: list = []

    def start(port: int) -> None:
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    started.append((proc, url))
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        proc.kill()
        raise RuntimeError(f"{name} did not start on {port}")

    on_a_free_port(start)
    return started[0]


@pytest.fixture()
def pushgateway():
    proc, url = _prometheus_daemon("prometheus-pushgateway")
    yield url
    proc.kill()
    proc.wait()


def test_a_run_pushes_while_it_runs_and_once_at_the_end_with_its_status(tmp_path, pushgateway):
    proc = _start(tmp_path, "--set", f"metrics.pushgateway='{pushgateway}'", "--set", "metrics.push_interval_s=0.2",
                  "--set", "metrics.instance='node-1'", "--set", "metrics.deadline='2030-01-01T00:00:00Z'")  # fmt: skip
    seen_mid = False
    while proc.poll() is None:
        text = httpx.get(f"{pushgateway}/metrics", timeout=10).text
        done = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "bulkinfer_job_rows_done"]  # fmt: skip
        seen_mid = seen_mid or bool(done and 0 < done[0] < ROWS)
        time.sleep(0.1)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert seen_mid  # pushed while it ran
    text = httpx.get(f"{pushgateway}/metrics", timeout=10).text
    final = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("bulkinfer")}
    assert final["bulkinfer_job_exit_code"].value == 0 and final["bulkinfer_job_rows_done"].value == ROWS
    labels = final["bulkinfer_job_rows_done"].labels
    assert (labels["job"], labels["instance"], labels["bulkinfer_job"]) == ("bulkinfer", "node-1", "out")
    assert final["bulkinfer_job_deadline_timestamp_seconds"].value == 1893456000


def test_the_shipped_alert_rules_pass_their_promtool_tests_and_the_tests_can_fail(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: run make test (tools/system_deps.sh installs Debian's prometheus)")
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((MONITORING / "alerts_test.yml").read_text())
    fired = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert alerts == fired  # each alert has a case where it fires (and the exact lists: none other does)
    run = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=MONITORING, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("alerts.yml", "alerts_test.yml"):
        shutil.copy(MONITORING / name, tmp_path / name)
    broken = (tmp_path / "alerts.yml").read_text().replace("> 900", "> 90000")  # a stall alert that never fires
    (tmp_path / "alerts.yml").write_text(broken)
    run = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and "BulkinferJobStalled" in run.stdout + run.stderr


def _prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen, str]:
    """Debian's Prometheus scraping ``target`` (host:port) every second; (process, its URL)."""
    (tmp_path / "prometheus.yml").write_text(textwrap.dedent(f"""
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: bulkinfer
            static_configs: [{{targets: ["{target}"]}}]
    """))  # fmt: skip
    return _prometheus_daemon(
        "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"
    )


def _panels(name: str, variable: str) -> dict[str, str]:
    """A shipped dashboard's queries by panel title (after dashboards.py --check: it is what the code makes)."""
    import json

    check = subprocess.run([sys.executable, str(MONITORING / "dashboards.py"), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    board = json.loads((MONITORING / name).read_text())
    return {p["title"]: t["expr"].replace(f"${variable}", ".+") for p in board["panels"] for t in p["targets"]}


def _until_every_panel_has_series(url: str, exprs: dict[str, str], alive) -> None:
    empty, deadline = dict(exprs), time.monotonic() + 90
    while empty:
        assert alive() and time.monotonic() < deadline, f"no series for {sorted(empty)}"
        for title, expr in list(empty.items()):
            answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
            assert answer["status"] == "success", (title, answer)
            if answer["data"]["result"]:
                del empty[title]
        time.sleep(0.5)


def test_every_run_dashboard_panel_returns_series_from_a_prometheus_that_scraped_a_run(tmp_path):
    exprs = _panels("job-dashboard.json", "job")
    assert len(exprs) == 10
    proc = _start(tmp_path, "--metrics-port", "0", model=MODEL.replace("0.01 *", "0.1 *"))  # a run of about 20 s
    assert proc.stderr is not None
    port = next(m.group(1) for line in proc.stderr if (m := re.search(r"metrics at http://[^:]+:(\d+)/", line)))
    prom, url = _prometheus(tmp_path, f"127.0.0.1:{port}")
    try:
        _until_every_panel_has_series(url, exprs, lambda: proc.poll() is None)
    finally:
        prom.kill()
        proc.kill()
        proc.wait()


def test_every_server_dashboard_panel_returns_series_from_a_prometheus_that_scraped_serve(tmp_path):
    import threading

    from helpers import Server

    exprs = _panels("server-dashboard.json", "instance")
    assert len(exprs) == 8
    server = Server(["-m", "minilm", "--batches", "state"], tmp_path)
    prom, url = _prometheus(tmp_path, server.url.removeprefix("http://"))
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                client.post(f"{server.url}/v1/embeddings", json={"model": "minilm", "input": ["a red shoe", "a dog"]})
                client.get(f"{server.url}/v1/nope")

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        _until_every_panel_has_series(url, exprs, lambda: server.proc.poll() is None)
    finally:
        stop.set()
        sender.join(timeout=30)
        prom.kill()
        server.stop()
