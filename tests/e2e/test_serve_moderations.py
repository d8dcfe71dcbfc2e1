"""``serve`` answers OpenAI's ``POST /v1/moderations`` from a job's models: the official client's
``moderations.create`` with text, a list of texts, and text with a picture (a data URL); every
answer validates against OpenAI's published ``CreateModerationResponse``; bad input is a 400
naming the field; a category left unmapped is refused at start."""

from __future__ import annotations

import base64
import io
import json
import re
import time

import httpx
import pytest
from PIL import Image

from bulkinfer import ConfigError, load_config

from helpers import Server, cli, fresh_module, openai_schema_errors

MODELS = '''
import numpy as np
from bulkinfer.adapters import Adapter
from bulkinfer.adapters.image import ImageAdapter


class Toxic(Adapter):
    output_columns = ("toxic",)

    def predict(self, batch):
        texts = batch.column(0).to_pylist()
        return {"toxic": [min(1.0, sum(t.lower().count(w) for w in ("hate", "kill")) / 2) for t in texts]}


class Redness(ImageAdapter):
    output_columns = ("red",)

    def predict(self, images):
        return {"red": [float((im[:, :, 0] > 200).mean()) for im in images]}
'''

OTHERS = ["harassment", "harassment/threatening", "hate/threatening", "illicit", "illicit/violent", "self-harm",
          "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence/graphic"]  # fmt: skip


def job_toml(module: str, leave_out: str | None = None) -> str:
    categories = {"hate": ("text.toxic", 0.8), "violence": ("pic.red", 0.5), **{c: ("0", 0.5) for c in OTHERS}}
    lines = "\n".join(f'"{c}" = {{score = "{s}", threshold = {t}}}' for c, (s, t) in categories.items() if c != leave_out)
    return f"""
[models.text]
name = "{module}:Toxic"
text_column = "text"

[models.pic]
name = "{module}:Redness"

[moderation.categories]
{lines}
"""


def data_url(color: str) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def server(tmp_path, monkeypatch):
    module = fresh_module(tmp_path, monkeypatch, "moderation_models", MODELS)
    (tmp_path / "job.toml").write_text(job_toml(module))
    srv = Server(["job.toml", "--batches", "state"], cwd=tmp_path)
    yield srv
    srv.stop()


def test_the_openai_client_moderates_text_lists_and_pictures_as_the_spec_says(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    one = client.moderations.create(input="I hate it, kill it")
    (result,) = one.results
    assert result.flagged and result.categories.hate and not result.categories.violence
    assert result.category_scores.hate == 1.0 and result.category_scores.violence == 0.0
    assert result.category_applied_input_types.hate == ["text"] and result.category_applied_input_types.violence == []
    two = client.moderations.create(input=["a calm day", "I hate spam"], model="text+pic")
    assert [r.flagged for r in two.results] == [False, False]  # 0.5 is under hate's 0.8
    assert [r.category_scores.hate for r in two.results] == [0.0, 0.5] and two.model == "text+pic"
    mixed = client.moderations.create(input=[{"type": "text", "text": "a red square"},
                                             {"type": "image_url", "image_url": {"url": data_url("red")}}])  # fmt: skip
    (result,) = mixed.results
    assert result.flagged and result.categories.violence and result.category_scores.violence == 1.0
    assert result.category_applied_input_types.violence == ["image"]  # text is scored by hate's model only
    assert result.category_applied_input_types.hate == ["text"]
    blue = client.moderations.create(input=[{"type": "image_url", "image_url": {"url": data_url("blue")}}])
    assert not blue.results[0].flagged and blue.results[0].category_applied_input_types.hate == []
    for body in ({"input": "I hate it"}, {"input": ["x", "y"]},
                 {"input": [{"type": "image_url", "image_url": {"url": data_url("red")}}]}):  # fmt: skip
        answer = httpx.post(f"{server.url}/v1/moderations", json=body).json()
        assert openai_schema_errors("CreateModerationResponse", answer) == []
        assert openai_schema_errors("CreateModerationRequest", body) == []  # what the client may send


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
         "input[0].image_url.url", "expected a data URL"),

        ({"input": []}, "input", "expected a string, a list of strings"),
        ({"input": "x", "temperature": 0}, "temperature", "not a field of a moderations request"),
    ],
)  # fmt: skip
def test_bad_requests_are_400s_naming_the_field(server, body, param, message):
    answer = httpx.post(f"{server.url}/v1/moderations", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert re.search(message, error["message"]), error["message"]


def test_a_model_the_job_does_not_run_is_a_404_model_not_found(server):
    answer = httpx.post(f"{server.url}/v1/moderations", json={"input": "x", "model": "omni-moderation-latest"})
    assert answer.status_code == 404 and openai_schema_errors("ErrorResponse", answer.json()) == []
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("model", "model_not_found") and "this job runs 'text+pic'" in error["message"]
    assert openai_schema_errors("ErrorResponse", answer.json()) == []


def test_a_category_left_unmapped_or_a_column_no_model_writes_is_refused_at_start(tmp_path, monkeypatch):
    from bulkinfer.serve.server import Server as Serving

    module = fresh_module(tmp_path, monkeypatch, "moderation_models", MODELS)
    (tmp_path / "job.toml").write_text(job_toml(module, leave_out="self-harm/intent"))
    with pytest.raises(ConfigError, match=r"^moderation\.categories: self-harm/intent not mapped to a score"):
        Serving(load_config(tmp_path / "job.toml"))
    (tmp_path / "job.toml").write_text(job_toml(module).replace("text.toxic", "text.toxicity"))
    with pytest.raises(ConfigError, match=r"^moderation\.categories\.hate\.score: reads 'text\.toxicity', which model "
                                          r"'text' does not write \(it writes text\.toxic\)"):  # fmt: skip
        Serving(load_config(tmp_path / "job.toml"))


def moderation_lines(path) -> None:
    bodies = {"t1": {"input": "I hate it, kill it"}, "t2": {"input": ["a calm day", "hate"]},
              "p1": {"input": [{"type": "image_url", "image_url": {"url": data_url("red")}}]},
              "bad": {"input": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}}  # fmt: skip
    path.write_text("".join(
        json.dumps({"custom_id": k, "method": "POST", "url": "/v1/moderations", "body": b}) + "\n"
        for k, b in bodies.items()
    ))  # fmt: skip


def test_a_moderations_batch_through_the_service_and_bulkinfer_run_answers_as_the_spec_says(server, tmp_path):
    from openai import OpenAI

    moderation_lines(tmp_path / "mod.jsonl")
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    upload = client.files.create(file=(tmp_path / "mod.jsonl").open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/moderations", completion_window="24h")
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch.errors
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    out = {x["custom_id"]: x for x in map(json.loads, client.files.content(batch.output_file_id).text.splitlines())}
    (bad,) = map(json.loads, client.files.content(batch.error_file_id).text.splitlines())
    assert bad["custom_id"] == "bad" and "expected a data URL" in json.dumps(bad)
    for x in out.values():
        assert openai_schema_errors("CreateModerationResponse", x["response"]["body"]) == []
    assert out["t1"]["response"]["body"]["results"][0]["categories"]["hate"] is True
    assert [r["category_scores"]["hate"] for r in out["t2"]["response"]["body"]["results"]] == [0.0, 0.5]
    assert out["p1"]["response"]["body"]["results"][0]["categories"]["violence"] is True
    ran = cli("run", "job.toml", "--input", "mod.jsonl", "--output", "ran", "--progress", "none", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    mine = {x["custom_id"]: x for x in map(json.loads, (tmp_path / "ran" / "_batch_output.jsonl").read_text().splitlines())}
    assert {k: x["response"]["body"]["results"] for k, x in mine.items()} == {
        k: x["response"]["body"]["results"] for k, x in out.items()
    }
