"""OpenLineage events, sent by openlineage-python's HTTP transport to a real HTTP receiver
started here: START then COMPLETE, FAIL or ABORT (SIGTERM), each checked against the
client's own event model (its generated classes and their validators)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import attr
import pytest

from bulkinfer import run_job
from bulkinfer.core.errors import ErrorBudgetExceeded

from helpers import BULKINFER, job_config, tabular_table, train_classifier, wait_commits, write


class Receiver:
    """An HTTP endpoint that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                events.append({"path": self.path, **json.loads(body)})
                self.send_response(201)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()


def validate(event: dict) -> None:
    """The event satisfies the client's model: required fields, enums, formats, facet classes."""
    from openlineage.client.event_v2 import RunEvent, RunState
    from openlineage.client.generated import (
        error_message_run,
        job_type_job,
        output_statistics_output_dataset,
        processing_engine_run,
        schema_dataset,
        tags_job,
        tags_run,
    )

    required = {a.name for a in attr.fields(RunEvent) if a.default is attr.NOTHING}
    assert required <= set(event) and event["eventType"] in {s.value for s in RunState}
    assert event["schemaURL"].startswith("https://openlineage.io/spec/")
    assert datetime.fromisoformat(event["eventTime"].replace("Z", "+00:00")).tzinfo is not None
    uuid.UUID(event["run"]["runId"])
    known = {
        ("run", "processing_engine"): processing_engine_run.ProcessingEngineRunFacet,
        ("run", "errorMessage"): error_message_run.ErrorMessageRunFacet,
        ("run", "tags"): tags_run.TagsRunFacet,
        ("job", "jobType"): job_type_job.JobTypeJobFacet,
        ("job", "tags"): tags_job.TagsJobFacet,
        ("dataset", "schema"): schema_dataset.SchemaDatasetFacet,
        ("output", "outputStatistics"): output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet,
    }
    facets = [
        *(("run", kv) for kv in event["run"]["facets"].items()),
        *(("job", kv) for kv in event["job"]["facets"].items()),
        *(("dataset", kv) for d in event["outputs"] for kv in d["facets"].items()),
        *(("output", kv) for d in event["outputs"] for kv in d["outputFacets"].items()),
    ]
    for level, (name, facet) in facets:
        assert facet["_producer"] and facet["_schemaURL"].startswith("https://"), name
        if (level, name) in known:
            cls = known[(level, name)]
            assert facet["_schemaURL"] == cls._get_schema(), name
            cls(**{k: v for k, v in facet.items() if not k.startswith("_")})  # the client's validators and fields


def cfg_for(tmp_path, receiver, out="out", **extra):
    return job_config(tmp_path / out, [tmp_path / "in.parquet"], **{
        "model.name": str(tmp_path / "m.joblib"), "source.shard_rows": 300, "lineage.url": receiver.url,
        "lineage.file": str(tmp_path / "events.jsonl"), "cost.labels": {"team": "risk", "model": "rf-v3"}, **extra,
    })  # fmt: skip


def test_start_and_complete_events(tmp_path, receiver):
    train_classifier(tmp_path / "m.joblib")
    write(tabular_table(1000, seed=3), tmp_path / "in.parquet")
    result = run_job(cfg_for(tmp_path, receiver))
    assert [e["eventType"] for e in receiver.events] == ["START", "COMPLETE"]
    assert {e["path"] for e in receiver.events} == {"/api/v1/lineage"}
    on_file = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["eventType"] for e in on_file] == ["START", "COMPLETE"]
    start, done = receiver.events
    for e in (start, done):
        validate(e)
        assert e["run"]["runId"] == start["run"]["runId"]
        assert e["inputs"] == [{"namespace": "file", "name": str(tmp_path / "in.parquet"), "facets": {},
                                "inputFacets": {}}]  # fmt: skip
        assert e["outputs"][0]["namespace"] == "file" and e["outputs"][0]["name"] == str(tmp_path / "out")
        assert e["job"]["namespace"] == "bulkinfer" and e["job"]["name"] == "out"
        model = e["job"]["facets"]["bulkinfer_model"]
        job = json.loads((tmp_path / "out" / "_bulkinfer" / "job.json").read_text())
        assert (model["kind"], model["digest"], model["precision"]) == ("tabular", job["model_digest"], "fp32")
        assert e["run"]["facets"]["bulkinfer_run"]["fingerprint"] == job["fingerprint"]
        tags = {t["key"]: t["value"] for t in e["job"]["facets"]["tags"]["tags"]}
        assert tags == {"team": "risk", "model": "rf-v3"}
    stats = done["outputs"][0]["outputFacets"]["outputStatistics"]
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert stats["rowCount"] == 1000 == result.report["rows_out"]
    assert stats["fileCount"] == len(manifest["files"]) and stats["size"] == sum(f["bytes"] for f in manifest["files"])
    fields = {f["name"]: f["type"] for f in done["outputs"][0]["facets"]["schema"]["fields"]}
    assert fields == {  # the dataset's columns as readers find them, the input hashes among them
        "id": "int64", "prediction": "string", "proba_no": "double", "proba_yes": "double", "_input_hash": "uint64"
    }  # fmt: skip
    assert done["run"]["facets"]["bulkinfer_run"]["rowsWritten"] == 1000


FAILING = textwrap.dedent("""
    def broken(table):
        raise ValueError("no row passes")
""")


def test_fail_event_and_a_receiver_that_is_down(tmp_path, receiver, monkeypatch, caplog):
    (tmp_path / "failmodels.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tabular_table(200, seed=3), tmp_path / "in.parquet")
    cfg = cfg_for(tmp_path, receiver, **{"model.name": "failmodels:broken", "model.feature_columns": ["x1"],
                                         "execution.max_errors": 0})  # fmt: skip
    with pytest.raises(ErrorBudgetExceeded):
        run_job(cfg)
    assert [e["eventType"] for e in receiver.events] == ["START", "FAIL"]
    fail = receiver.events[1]
    validate(fail)
    assert "over the error budget" in fail["run"]["facets"]["errorMessage"]["message"]
    sys.modules.pop("failmodels", None)

    # nobody listening: one warning line, the run itself is unharmed
    train_classifier(tmp_path / "m.joblib")
    down = cfg_for(tmp_path, receiver, "out2", **{"lineage.url": "http://127.0.0.1:9", "lineage.file": None})
    with caplog.at_level(logging.WARNING, logger="bulkinfer"):
        assert run_job(down).report["rows_out"] == 200
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lineage:")]
    assert len(lines) == 1 and lines[0].startswith("lineage: could not send the START event to http://127.0.0.1:9")
    assert lines[0].endswith("; no more events go there in this run")


def test_sigterm_sends_abort(tmp_path, receiver):
    train_classifier(tmp_path / "m.joblib")
    write(tabular_table(3000, seed=3), tmp_path / "in.parquet")
    args = ["run", "-i", str(tmp_path / "in.parquet"), "-m", str(tmp_path / "m.joblib"), "--id-column", "id",
            "-o", str(tmp_path / "out"), "--shard-rows", "100", "--batch-size", "8", "--progress", "none",
            "--set", f"lineage.url={receiver.url}"]  # fmt: skip
    proc = subprocess.Popen([*BULKINFER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_commits(tmp_path / "out", 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert [e["eventType"] for e in receiver.events] == ["START", "ABORT"]
    validate(receiver.events[1])
    assert receiver.events[1]["run"]["facets"]["bulkinfer_run"]["rowsWritten"] >= 200
