"""OpenAI Batch API files in and out, with a tiny random-weight causal LM built here and the
bundled embedding model: every output line parses with the ``openai`` package's own types,
bad lines are error lines of their own request, the rest of the file runs, a stopped job
resumes answering each custom_id exactly once."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types import BatchError, Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from bulkinfer import load_config, run_job
from bulkinfer.core.errors import Interrupted

from helpers import stop_after_commits
from tiny_lm import WORDS, tiny_lm

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["spam", "ham"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["label", "score", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_lm(tmp_path_factory.mktemp("m") / "tiny-llama", "llama")


def request(cid, url=CHAT, **body):
    return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "tiny-llama", **body}}


def chat(cid, text, **extra):
    return request(cid, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0, **extra)


def batch_lines():
    good = [chat(f"c{i}", " ".join(WORDS[i : i + 2 + i % 4])) for i in range(6)]
    good += [request(f"p{i}", COMPLETIONS, prompt=" ".join(WORDS[i + 3 : i + 6]), max_tokens=6, temperature=0)
             for i in range(2)]  # fmt: skip
    good.append(request("j0", messages=[{"role": "user", "content": "label this"}], max_tokens=40, temperature=1.0,
                        seed=3, response_format={"type": "json_schema", "json_schema": {"name": "l", "schema": SCHEMA}}))  # fmt: skip
    bad = {
        "c0": chat("c0", "a second request reusing c0"),
        "bad-url": request("bad-url", "/v1/images/generations", prompt="a cat"),
        "bad-model": {**chat("bad-model", "fox"), "body": {**chat("x", "fox")["body"], "model": "gpt-4o"}},
        "too-long": chat("too-long", " ".join(WORDS * 6)),
        "n2": chat("n2", "fox", n=2),
        "nomsg": request("nomsg", max_tokens=3),
    }
    lines = [json.dumps(x) for x in good[:4]]
    lines += ["this is not json {", json.dumps({"method": "POST", "url": CHAT, "body": {}})]
    lines += [json.dumps(x) for x in good[4:]] + [json.dumps(x) for x in bad.values()]
    return lines, good, bad


def run(model, tmp_path, out, lines, **extra):
    src = tmp_path / "requests.jsonl"
    src.write_text("\n".join(lines) + "\n")
    cfg = load_config(overrides={"source.paths": [str(src)], "model.name": str(model), "sink.path": str(tmp_path / out),
                                 "source.shard_rows": 4, "execution.progress": "none", "execution.max_error_rate": 1.0,
                                 **extra})  # fmt: skip
    return cfg


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_file_answers_good_requests_and_lists_bad_ones(model, tmp_path):
    lines, good, bad = batch_lines()
    result = run_job(run(model, tmp_path, "out", lines))
    out = tmp_path / "out"
    assert result.report["rows_out"] == len(good) and result.report["rows_failed"] == len(bad) + 2
    answers = read_lines(out / "_batch_output.jsonl")
    assert sorted(a["custom_id"] for a in answers) == sorted(g["custom_id"] for g in good)
    parts = [json.loads(x) for p in sorted(out.glob("part-*.jsonl")) for x in p.read_text().splitlines()]
    assert sorted(a["custom_id"] for a in parts) == sorted(a["custom_id"] for a in answers)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    by_id = {g["custom_id"]: g for g in good}
    for a in answers:
        assert a["error"] is None and a["response"]["status_code"] == 200 and a["id"].startswith("batch_req-")
        asked = by_id[a["custom_id"]]
        if asked["url"] == CHAT:
            body = ChatCompletion.model_validate(a["response"]["body"])
            prompt = tok.apply_chat_template(asked["body"]["messages"], tokenize=False, add_generation_prompt=True)
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            text = body.choices[0].message.content
        else:
            body = Completion.model_validate(a["response"]["body"])
            ids = tok(asked["body"]["prompt"])["input_ids"]
            text = body.choices[0].text
        assert body.model == "tiny-llama" and body.usage.prompt_tokens == len(ids)
        assert body.usage.total_tokens == body.usage.prompt_tokens + body.usage.completion_tokens
        if a["custom_id"] == "j0":  # sampled at temperature 1 from random weights, constrained to the schema
            assert body.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert body.choices[0].finish_reason in ("stop", "length") and body.usage.completion_tokens <= 8
            assert text == greedy(model, ids, asked["body"]["max_tokens"])

    errors = read_lines(out / "_batch_errors.jsonl")
    assert len({x["id"] for x in errors + answers}) == len(errors) + len(answers)  # one id per line
    unreadable = [e for e in errors if e["custom_id"] is None]
    assert sorted(BatchError.model_validate(e["error"]).line for e in unreadable) == [5, 6]
    assert all(e["response"] is None for e in unreadable)
    refused = {e["custom_id"]: e for e in errors if e["custom_id"] is not None}
    assert set(refused) == set(bad)
    for cid, e in refused.items():  # a model the job does not run is OpenAI's 404 model_not_found, the rest 400s
        assert e["error"] is None and e["response"]["status_code"] == (404 if cid == "bad-model" else 400)
        assert e["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert refused["bad-model"]["response"]["body"]["error"]["code"] == "model_not_found"
    said = {cid: e["response"]["body"]["error"]["message"] for cid, e in refused.items()}
    assert "already used by an earlier line" in said["c0"] and "'/v1/images/generations'" in said["bad-url"]
    assert "'gpt-4o'" in said["bad-model"] and "over the model's context of 64" in said["too-long"]
    assert said["n2"].startswith("n:") and said["nomsg"].startswith("messages:")


def greedy(model, ids, max_new_tokens):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model).eval()
    x = torch.tensor([ids])
    with torch.inference_mode():
        gen = lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    new = gen[0, len(ids) :].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    return tok.decode(new, skip_special_tokens=True)


def test_stopped_batch_job_resumes_answering_each_custom_id_once(model, tmp_path):
    lines, good, _bad = batch_lines()
    clean = run_job(run(model, tmp_path, "clean", lines))
    assert clean.status == "complete"
    cfg = run(model, tmp_path, "out", lines)
    with pytest.raises(Interrupted):
        run_job(cfg, stop=stop_after_commits(tmp_path / "out", 1))
    assert not (tmp_path / "out" / "_batch_output.jsonl").exists()  # written once the job is complete
    resumed = run_job(cfg)
    assert 0 < resumed.report["rows_out"] < len(good)  # only what the first run had not committed

    def answers(out):
        rows = read_lines(tmp_path / out / "_batch_output.jsonl")
        return sorted((a["custom_id"], json.dumps(a["response"]["body"]["choices"])) for a in rows)

    assert answers("out") == answers("clean")  # every custom_id once, with the same answer
    errors = sorted(str(e["custom_id"]) for e in read_lines(tmp_path / "out" / "_batch_errors.jsonl"))
    assert errors == sorted(str(e["custom_id"]) for e in read_lines(tmp_path / "clean" / "_batch_errors.jsonl"))


def test_embeddings_requests_go_to_the_embedding_model(tmp_path):
    texts = ["red running shoes", "a lazy dog", "quick brown fox"]
    lines = [
        json.dumps({"custom_id": "e0", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "minilm", "input": texts[:2]}}),
        json.dumps({"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "minilm", "input": texts[2], "encoding_format": "base64"}}),
        json.dumps({"custom_id": "g0", "method": "POST", "url": CHAT,
                    "body": {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}}),
        # lines OpenAI refuses: a field a line does not have, an empty input, no method
        json.dumps({"custom_id": "x0", "method": "POST", "url": "/v1/embeddings", "priority": "high",
                    "body": {"model": "minilm", "input": "x"}}),
        json.dumps({"custom_id": "x1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm", "input": ""}}),
        json.dumps({"custom_id": "x2", "url": "/v1/embeddings", "body": {"model": "minilm", "input": "x"}}),
    ]  # fmt: skip
    src = tmp_path / "emb.jsonl"
    src.write_text("\n".join(lines) + "\n")
    result = run_job(load_config(overrides={"source.paths": [str(src)], "model.name": "minilm",
                                            "sink.path": str(tmp_path / "out"), "execution.progress": "none",
                                            "execution.max_error_rate": 1.0}))  # fmt: skip
    assert result.report["rows_out"] == 2 and result.report["rows_failed"] == 4
    got = {a["custom_id"]: a for a in read_lines(tmp_path / "out" / "_batch_output.jsonl")}
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from bulkinfer.adapters import _alias_path

    want = SentenceTransformer(str(_alias_path("minilm")), device="cpu").encode(texts)
    e0 = CreateEmbeddingResponse.model_validate(got["e0"]["response"]["body"])
    assert [d.index for d in e0.data] == [0, 1] and e0.usage.prompt_tokens > 4
    np.testing.assert_allclose(np.array([d.embedding for d in e0.data]), want[:2], atol=2e-5)
    raw = got["e1"]["response"]["body"]["data"][0]["embedding"]
    import base64

    np.testing.assert_allclose(np.frombuffer(base64.b64decode(raw), np.float32), want[2], atol=2e-5)
    errors = {e["custom_id"]: e["response"]["body"]["error"] for e in read_lines(tmp_path / "out" / "_batch_errors.jsonl")}
    assert "makes embeddings" in errors.pop("g0")["message"]
    assert {c: e["message"] for c, e in errors.items()} == {
        "x0": "priority: not a field of a batch request line (custom_id, method, url, body)",
        "x1": "input[0]: an empty string; give text to embed",
        "x2": 'method: missing; every request line says "method": "POST"',
    }


def _mostly_bad_batch(path) -> list[str]:
    """Ten embedding requests of which four are bad lines (not JSON, no body, another endpoint,
    another model's name is fine): the custom_ids of the good ones."""
    good = [f"e{i}" for i in range(6)]
    lines = [json.dumps({"custom_id": c, "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": "minilm", "input": f"text {c}"}}) for c in good]  # fmt: skip
    bad = ['{"custom_id": "b1", "method": "POST"', json.dumps({"custom_id": "b2", "method": "POST",
           "url": "/v1/embeddings"}), json.dumps({"custom_id": "b3", "method": "POST", "url": "/v1/moderations",
           "body": {"input": "x"}}), json.dumps({"custom_id": "b4", "method": "POST", "url": "/v1/embeddings",
           "body": {"model": "minilm"}})]  # fmt: skip
    # bad lines first in the file (rows 0, 2, 4, 6), good ones between
    order = [bad[0], lines[0], bad[1], lines[1], bad[2], lines[2], bad[3], *lines[3:]]
    path.write_text("\n".join(order) + "\n")
    return good


def test_a_batch_file_with_many_bad_lines_completes_with_its_error_file(tmp_path):
    """40% bad lines: over any default budget, but a bad line is its own request's answer (the
    Batch API's contract): the job completes, every request is in one of the two files."""
    src = tmp_path / "mixed.jsonl"
    good = _mostly_bad_batch(src)
    base = {"source.paths": [str(src)], "model.name": "minilm", "execution.progress": "none"}
    result = run_job(load_config(overrides={**base, "sink.path": str(tmp_path / "out")}))
    assert result.status == "complete" and result.report["rows_out"] == 6 and result.report["rows_failed"] == 4
    answered = sorted(a["custom_id"] for a in read_lines(tmp_path / "out" / "_batch_output.jsonl"))
    failed = [e["custom_id"] for e in read_lines(tmp_path / "out" / "_batch_errors.jsonl")]
    assert answered == sorted(good) and len(failed) == 4 and (tmp_path / "out" / "_SUCCESS").exists()

    # a budget the job sets is honoured, and the error names the first bad line in file order
    from bulkinfer import ErrorBudgetExceeded

    with pytest.raises(ErrorBudgetExceeded, match=r"first: .*row 0\b"):
        run_job(load_config(overrides={**base, "sink.path": str(tmp_path / "capped"), "execution.max_errors": 1}))
