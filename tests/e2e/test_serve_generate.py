"""`bulkinfer serve` with a tiny random-weight causal LM, called by the `openai` client:
chat and text completions, whole and streamed (server-sent events), concurrent requests
merged, answers equal to the offline batch run of the same requests, and the same requests
as a batch of the batch service."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import BadRequestError, OpenAI

from bulkinfer import load_config, run_job

from helpers import Server, openai_schema_errors
from tiny_lm import WORDS, tiny_lm

PROMPTS = [" ".join(WORDS[i : i + 2 + i % 5]) for i in range(8)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen")
    model = tiny_lm(d / "tiny-llama", "llama")
    server = Server(["-m", str(model), "--set", "serve.max_wait_ms=20", "--set", "model.max_new_tokens=10",
                     "--batches", "state"], d)  # fmt: skip
    yield server, model, d
    server.stop()


def offline_answers(model, d):
    """The same requests through an OpenAI batch file, offline (run once per module)."""
    if (d / "offline" / "_SUCCESS").exists():
        return _answers(d)
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "tiny-llama", "messages": [{"role": "user", "content": p}],
                                  "max_tokens": 10, "temperature": 0}})
             for i, p in enumerate(PROMPTS)]  # fmt: skip
    (d / "req.jsonl").write_text("\n".join(lines) + "\n")
    run_job(load_config(overrides={"source.paths": [str(d / "req.jsonl")], "model.name": str(model),
                                   "sink.path": str(d / "offline"), "execution.progress": "none"}))  # fmt: skip
    return _answers(d)


def _answers(d):
    rows = [json.loads(x) for x in (d / "offline" / "_batch_output.jsonl").read_text().splitlines()]
    by_id = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in rows}
    return [by_id[f"r{i}"] for i in range(len(PROMPTS))]


def test_chat_whole_streamed_and_concurrent_equal_the_offline_run(served):
    server, model, d = served
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    def ask(p):
        r = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": p}],
                                           max_tokens=10, temperature=0)  # fmt: skip
        return r

    with ThreadPoolExecutor(8) as pool:  # concurrent: merged into shared model calls
        answers = list(pool.map(ask, PROMPTS))
    assert [a.choices[0].message.content for a in answers] == offline_answers(model, d)
    assert all(a.usage.completion_tokens <= 10 and a.model == "tiny-llama" for a in answers)

    chunks = list(client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPTS[3]}],
                                                 max_tokens=10, temperature=0, stream=True))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answers[3].choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant" and len(chunks) >= 3
    assert chunks[-1].choices[0].finish_reason == answers[3].choices[0].finish_reason
    raw = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 5})  # fmt: skip
    assert openai_schema_errors("CreateChatCompletionResponse", raw.json()) == []
    streamed = httpx.post(
        f"{server.url}/v1/chat/completions",
        timeout=60,
        json={
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": PROMPTS[0]}],
            "max_tokens": 5,
            "stream": True,
        },
    )
    events = [json.loads(x[6:]) for x in streamed.text.splitlines() if x.startswith("data: {")]  # fmt: skip
    assert events and [openai_schema_errors("CreateChatCompletionStreamResponse", e) for e in events] == [[]] * len(
        events
    )


def test_text_completions_stream_with_usage_and_bad_requests_are_400(served):
    server, _model, _d = served
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    whole = client.completions.create(model="tiny-llama", prompt="the lazy dog", max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model="tiny-llama", prompt="the lazy dog", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    raw = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny-llama", "prompt": "fox", "max_tokens": 4},
                     timeout=60)  # fmt: skip
    assert openai_schema_errors("CreateCompletionResponse", raw.json()) == []
    bad = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny-llama", "prompt": "fox", "n": 2}, timeout=60)
    assert bad.status_code == 400 and openai_schema_errors("ErrorResponse", bad.json()) == []

    with pytest.raises(BadRequestError, match="only one completion per request"):
        client.completions.create(model="tiny-llama", prompt="fox", n=2)
    with pytest.raises(BadRequestError, match="over the model's context of 64"):
        client.completions.create(model="tiny-llama", prompt=" ".join(WORDS * 6), max_tokens=4)
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": "tiny-llama", "input": "x"}, timeout=30)
    assert r.status_code == 404 and "no embeddings" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/predict", json={"rows": [{"text": "x"}]}, timeout=30)
    assert r.status_code == 404 and "/v1/chat/completions" in r.json()["error"]["message"]


def test_a_chat_batch_of_the_batch_service_answers_as_the_offline_run(served):
    server, model, d = served
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    offline = offline_answers(model, d)  # writes req.jsonl
    upload = client.files.create(file=(d / "req.jsonl").open("rb"), purpose="batch")
    with pytest.raises(BadRequestError, match="answers /v1/chat/completions and /v1/completions"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert batch.status == "completed" and batch.request_counts.completed == len(PROMPTS)
    rows = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    by_id = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in rows}
    assert [by_id[f"r{i}"] for i in range(len(PROMPTS))] == offline


def test_the_remote_batch_docs_example_runs_against_the_batch_service_as_a_local_generation_job(served):
    """docs/remote-batch.md's job, pointed at this server: the same answers as the same job run
    locally on the same model (the prompts are rendered alike), label a typed column."""
    import re
    from pathlib import Path

    import pyarrow as pa

    from helpers import cli, read_output, write

    server, model, d = served
    page = (Path(__file__).resolve().parents[2] / "docs" / "remote-batch.md").read_text()
    job = re.search(r"```toml\n(.*?)```", page, re.S).group(1)
    job = job.replace("https://api.openai.com/v1", f"{server.url}/v1").replace('"gpt-4o-mini"', '"tiny-llama"')
    job = job.replace("Label the support ticket.", "Label it.").replace("max_new_tokens = 50", "max_new_tokens = 12")
    subjects = ["fox", "the dog", "lazy", "quick brown"]
    write(pa.table({"ticket_id": [10, 11, 12, 13], "subject": subjects, "body": ["jumps"] * 4}), d / "tickets.parquet")
    (d / "remote.toml").write_text(job.replace('path = "labels/"', 'path = "labels-remote/"'))
    local = re.sub(r'kind = "remote-batch"\n|base_url = .*\n|endpoint = .*\n|api_key_env = .*\n|price_per.*\n', "", job)
    (d / "local.toml").write_text(local.replace('"tiny-llama"', f"'{model}'").replace("labels/", "labels-local/"))
    env = {**os.environ, "OPENAI_API_KEY": "unused"}
    cli("run", "remote.toml", "--set", "model.poll_s=0.2", "--progress", "none", cwd=d, env=env, check=True)
    cli("run", "local.toml", "--progress", "none", cwd=d, check=True)
    refused = cli("run", "local.toml", "--set", "model.poll_s=0.2", "-o", "x", cwd=d)  # a remote setting, locally
    assert refused.returncode == 1 and "model.poll_s: applies to model.kind = 'remote-batch'" in refused.stderr
    remote = read_output(d / "labels-remote").sort_by("ticket_id")
    local_out = read_output(d / "labels-local").sort_by("ticket_id")
    assert remote.column_names == ["ticket_id", "completion", "finish_reason", "prompt_tokens", "completion_tokens",
                                   "label"]  # fmt: skip
    assert remote["ticket_id"].to_pylist() == [10, 11, 12, 13]
    assert remote["completion"].to_pylist() == local_out["completion"].to_pylist()
    assert remote["prompt_tokens"].to_pylist() == local_out["prompt_tokens"].to_pylist()
    assert remote["label"].to_pylist() == local_out["label"].to_pylist()
