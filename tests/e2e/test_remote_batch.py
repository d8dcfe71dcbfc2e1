"""model.kind = "remote-batch": a table through a Batch API (bulkinfer's own batch server, a real
process) by the real client, killed at every step and rerun: every row once, no batch created
twice (the server's batch list proves it)."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import threading
import time

import httpx
import numpy as np
import pyarrow as pa
import pytest
from openai import NotFoundError, OpenAI

from helpers import BULKINFER, Server, cli, make_catalog, read_output, write

KEY = "sk-remote-0123456789"


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote")
    (d / "keys.txt").write_text(f"{KEY} id=client\n")
    server = Server(["-m", "minilm", "--batches", "state", "--set", "serve.api_keys_file='keys.txt'",
                     "--set", "serve.batch_shard_rows=50", "--set", "serve.max_batch_requests=250"], d)  # fmt: skip
    write(make_catalog(300, seed=4), d / "catalog.parquet")
    cli("run", "-i", "catalog.parquet", "-m", "minilm", "--text-column", "description", "--id-column", "id",
        "-o", "local", "--progress", "none", cwd=d, check=True)  # fmt: skip
    yield server, d
    server.stop()


def job_args(server: Server, out: str, src: str = "catalog.parquet") -> list[str]:
    return ["run", "-i", src, "-m", "minilm", "--text-column", "description", "--id-column", "id", "-o", out,
            "--progress", "none", "--set", "model.kind='remote-batch'", "--set", f"model.base_url='{server.url}/v1'",
            "--set", "model.endpoint='/v1/embeddings'", "--set", "model.poll_s=0.2", "--set", "source.shard_rows=100",
            "--set", "model.batch_max_requests=200", "--set", "model.api_key_env='REMOTE_KEY'"]  # fmt: skip


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "REMOTE_KEY": KEY, **extra}


def batches_of(server: Server, out) -> list:
    """The server's batches this output created (their tag names the output's run id)."""
    run = json.loads((out / "_bulkinfer" / "remote_batches.json").read_text())["run"]
    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    return [
        b for b in client.batches.list() if (b.metadata or {}).get("bulkinfer_tag", "").startswith(f"bulkinfer-{run}-")
    ]


def test_a_table_through_the_batch_api_equals_the_local_run(remote):
    server, d = remote
    price = ["--set", "model.price_per_million_tokens={input = 2.5}", "--set", "cost.labels={team = 'search'}"]
    logged = ["--progress", "log", "--set", "execution.log_interval_s=0.01"]
    ran = cli(*job_args(server, "out"), *price, *logged, cwd=d, env=env(), check=True)
    assert re.search(r"progress rows=\d+/300 .* batches=(completed|finalizing|in_progress|validating):", ran.stderr)
    assert "eta_s=nan" not in ran.stderr and "eta_s=unknown" in ran.stderr  # before the first answers
    page = (d / "out.html")
    cli("report", "out", "-o", str(page), cwd=d, check=True)
    assert "No stage of this run was busy here" in page.read_text() and "e-12" not in page.read_text()
    out, local = read_output(d / "out").sort_by("id"), read_output(d / "local").sort_by("id")
    assert out.column_names == ["id", "embedding"]  # a remote Batch API's output has no input hashes (yet)
    assert local.column_names == ["id", "embedding", "_input_hash"]
    assert out["id"].to_pylist() == local["id"].to_pylist() == list(range(300))
    np.testing.assert_allclose(np.stack(out["embedding"].to_numpy(zero_copy_only=False)),
                               np.stack(local["embedding"].to_numpy(zero_copy_only=False)), atol=2e-5)  # fmt: skip
    assert KEY not in (d / "out" / "_bulkinfer" / "job.json").read_text()
    assert json.loads((d / "out" / "_bulkinfer" / "report.json").read_text())["remote_batches"] == {"completed": 2}
    made = batches_of(server, d / "out")  # 3 shards of 100, at most 200 requests a file: two batches
    assert sorted(b.request_counts.total for b in made) == [100, 200] and {b.status for b in made} == {"completed"}
    # the spend, from each answer's usage, booked like local spend
    report = json.loads((d / "out" / "_bulkinfer" / "report.json").read_text())
    answers = [json.loads(x) for b in made for x in OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
               .files.content(b.output_file_id).text.splitlines()]  # fmt: skip
    billed = sum(a["response"]["body"]["usage"]["prompt_tokens"] for a in answers)
    assert report["tokens"]["prompt"] == billed > 300
    assert report["cost"]["remote_tokens"] == pytest.approx(billed * 2.5 / 1e6, abs=1e-6)
    booked = json.loads(cli("costs", "out", "--by", "team", "--format", "json", cwd=d, check=True).stdout)
    assert [(r["team"], r["rows"]) for r in booked] == [("search", 300)]
    assert booked[0]["cost"] == pytest.approx(report["cost"]["run"], abs=1e-6)


STEPS = ["remote-intent", "remote-uploaded", "remote-created", "remote-polled", "remote-downloaded"]


def test_a_client_killed_at_every_step_in_turn_reruns_to_every_row_once_without_a_second_batch(remote):
    """Killed after the intent, then (resuming) after the upload, after the create (before its
    id is recorded), while polling and after a download; the last rerun completes."""
    server, d = remote
    before = _server_batches(server)  # every batch on the server, whatever the client's own state says
    for step in STEPS:
        killed = cli(*job_args(server, "out-killed"), cwd=d, env=env(BULKINFER_CRASH_AT=step))
        assert killed.returncode == -signal.SIGKILL, (step, killed.stderr)
    cli(*job_args(server, "out-killed"), cwd=d, env=env(), check=True)
    table = read_output(d / "out-killed")
    assert sorted(table["id"].to_pylist()) == list(range(300))
    made = [b for b in _server_batches(server) if b.id not in {x.id for x in before}]
    assert len(made) == 2, [(b.id, b.metadata) for b in made]  # each rerun found what was created
    assert sorted(b.request_counts.total for b in made) == [100, 200]
    assert {b.id for b in made} == {b.id for b in batches_of(server, d / "out-killed")}


def _server_batches(server: Server) -> list:
    """Every batch the server holds for the key (a resume that lost its state file and paid twice
    shows here, where counting by the client's own run id would not)."""
    return list(OpenAI(base_url=f"{server.url}/v1", api_key=KEY).batches.list())


@pytest.mark.parametrize("cancel", [False, True])
def test_sigterm_leaves_the_remote_batches_running_or_cancels_them_when_told(remote, cancel):
    server, d = remote
    out = f"out-term-{cancel}"
    told = ["--set", f"model.cancel_on_stop={str(cancel).lower()}", "--set", "execution.max_error_rate=1"]
    args = [*job_args(server, out), "--set", "model.poll_s=30", *told]
    proc = subprocess.Popen([*BULKINFER, *args], cwd=d, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    state = d / out / "_bulkinfer" / "remote_batches.json"
    deadline = time.monotonic() + 60
    while not (
        state.exists() and sum(bool(g["batch_id"]) for g in json.loads(state.read_text())["groups"].values()) == 2
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 75 and time.monotonic() - t0 < 10
    statuses = {b.status for b in batches_of(server, d / out)}
    if cancel:
        assert statuses <= {"cancelling", "cancelled", "completed"} and statuses & {"cancelling", "cancelled"}
    else:
        assert statuses <= {"validating", "in_progress", "finalizing", "completed"}
    cli(*args[:-6], *told, cwd=d, env=env(), check=True)  # the rerun polls again: nothing is created anew
    table = read_output(d / out)  # cancelled before any answer: no part at all
    written = table["id"].to_pylist() if "id" in table.column_names else []
    errors = [json.loads(x)["row"] for f in (d / out / "_errors").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert sorted(written + errors) == list(range(300)) and (cancel or not errors)
    assert len(batches_of(server, d / out)) == 2


def test_rows_that_fail_remotely_are_error_records_and_retry_errors_resubmits_only_them(remote):
    server, d = remote
    texts = ["a short text", None, "word " * 600, "another text", "word " * 700]
    write(pa.table({"id": list(range(5)), "description": texts}), d / "mixed.parquet")
    budget = ["--set", "execution.max_error_rate=1", "--set", "source.shard_rows=2"]  # 3 shards: 3 error files
    done = cli(*job_args(server, "out-mixed", "mixed.parquet"), *budget, cwd=d, env=env())
    assert done.returncode == 0, done.stderr
    assert sorted(read_output(d / "out-mixed")["id"].to_pylist()) == [0, 3]
    errors = [json.loads(x) for f in sorted((d / "out-mixed" / "_errors").glob("*.jsonl"))
              for x in f.read_text().splitlines()]  # fmt: skip
    by_row = {e["row"]: e for e in errors}
    assert set(by_row) == {1, 2, 4} and by_row[1]["stage"] == "preprocess" and "null text" in by_row[1]["message"]
    assert "over the model's limit" in by_row[2]["message"] and by_row[2]["id"] == 2
    before = len(batches_of(server, d / "out-mixed"))
    again = cli("run", "--retry-errors", "out-mixed", "--progress", "none", cwd=d, env=env())  # the stored job
    assert again.returncode == 0, again.stderr
    made = batches_of(server, d / "out-mixed")
    # one batch for the failed rows of every error file (was one per file, each waiting for the last),
    # of only the two that made a request
    assert len(made) == before + 1 and made[0].request_counts.total == 2
    assert sorted(read_output(d / "out-mixed")["id"].to_pylist()) == [0, 3]
    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    for b in made:  # the request files (the job's inputs) are deleted from the provider once committed
        with pytest.raises(NotFoundError):
            client.files.retrieve(b.input_file_id)


class FaultyProxy:
    """An HTTP proxy to the batch server that answers some requests with a fault, once each:
    ``refuse`` (that status, not forwarded), ``after`` (forwarded, then a 502: the server did
    it, the client is told it failed) and ``cut`` (forwarded, the body cut in half)."""

    def __init__(self, upstream: str, rules: list[tuple[str, str, str]]) -> None:
        self.upstream, self.rules, self.fired = upstream, list(rules), []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                rule = next((r for r in proxy.rules if r[0] == self.command and re.search(r[1], self.path)), None)
                if rule is not None:
                    proxy.rules.remove(rule)
                    proxy.fired.append(rule)
                if rule is not None and rule[2].isdigit():
                    return self._answer(int(rule[2]), b'{"error": {"message": "injected"}}', "application/json")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers, timeout=60)
                if rule is not None and rule[2] == "after":
                    return self._answer(502, b'{"error": {"message": "bad gateway"}}', "application/json")
                content = r.content[: len(r.content) // 2] if rule is not None and rule[2] == "cut" else r.content
                self._answer(r.status_code, content, r.headers.get("content-type", "application/json"))

            def _answer(self, status: int, content: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(content)))
                self.send_header("retry-after-ms", "10")
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_faults_of_the_api_are_retried_or_recorded_never_a_lost_or_doubled_row(remote):
    server, d = remote
    proxy = FaultyProxy(server.url, [
        ("POST", r"^/v1/files$", "503"),  # refused: the client uploads again
        ("POST", r"^/v1/batches$", "429"),  # refused: created on the next try
        ("POST", r"^/v1/batches$", "after"),  # created, but the client hears a 502: found by its tag
        ("GET", r"^/v1/batches/batch_", "503"),
        ("GET", r"/content$", "cut"),  # a result file cut short: fetched again
    ])  # fmt: skip
    try:
        args = [a.replace(server.url, proxy.url) for a in job_args(server, "out-faults")]
        done = cli(*args, cwd=d, env=env())
        assert done.returncode == 0, done.stderr
    finally:
        proxy.httpd.shutdown()
    assert proxy.rules == [] and len(proxy.fired) == 5  # every fault happened
    assert sorted(read_output(d / "out-faults")["id"].to_pylist()) == list(range(300))
    assert len(batches_of(server, d / "out-faults")) == 2  # the 502'd create made no second batch


def test_a_batch_the_api_refuses_as_a_whole_makes_every_row_an_error_record(remote):
    server, d = remote
    args = [
        *job_args(server, "out-refused"),
        "--set",
        "model.batch_max_requests=300",
        "--set",
        "execution.max_error_rate=1",
    ]  # fmt: skip  (the server takes at most 250 requests a batch)
    done = cli(*args, cwd=d, env=env())
    assert done.returncode == 0, done.stderr
    errors = [json.loads(x) for f in sorted((d / "out-refused" / "_errors").glob("*.jsonl"))
              for x in f.read_text().splitlines()]  # fmt: skip
    assert sorted(e["row"] for e in errors) == list(range(300))
    assert all("failed validation" in e["message"] and "too_many_requests" in e["message"] for e in errors)


def test_a_refused_key_is_one_line_naming_its_variable(remote):
    server, d = remote
    refused = cli(*job_args(server, "out-badkey"), cwd=d, env=env(REMOTE_KEY="sk-wrong"))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "refused the key in REMOTE_KEY (401)" in refused.stderr.strip().splitlines()[-1]


def test_batch_max_requests_is_honoured_or_refused_never_broken(remote):
    """A shard's requests go into one file: with source.shard_rows left at its default (10,000) a
    120-request ceiling cuts the shards to 120 rows; a shard_rows set above the ceiling is refused
    before anything is sent (today's code sent one 300-request file)."""
    server, d = remote
    given = job_args(server, "out-ceiling")
    dropped = {"source.shard_rows=100", "model.batch_max_requests=200"}
    args = [a for i, a in enumerate(given) if a not in dropped and not (a == "--set" and given[i + 1] in dropped)]
    cli(*args, "--set", "model.batch_max_requests=120", cwd=d, env=env(), check=True)
    made = batches_of(server, d / "out-ceiling")
    assert sorted(b.request_counts.total for b in made) == [60, 120, 120]
    assert sorted(read_output(d / "out-ceiling")["id"].to_pylist()) == list(range(300))
    refused = cli(*job_args(server, "out-over-ceiling"), "--set", "model.batch_max_requests=50", cwd=d, env=env())
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "source.shard_rows = 100 is over model.batch_max_requests = 50" in refused.stderr
    assert not (d / "out-over-ceiling" / "_bulkinfer" / "remote_batches.json").exists()
    too_big = cli(*job_args(server, "out-bytes"), "--set", "model.batch_max_bytes=20000", cwd=d, env=env())
    last = too_big.stderr.strip().splitlines()[-1]
    assert too_big.returncode == 1 and "Traceback" not in too_big.stderr
    assert re.search(r"model\.batch_max_bytes: the requests of shards \[0, 1\] make \d+ bytes, over 20000", last), last
    assert not batches_of(server, d / "out-bytes")  # refused before a file was sent


class _LoginPage(http.server.BaseHTTPRequestHandler):
    """A proxy's login wall: 200 and an HTML page, whatever is asked."""

    def _page(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b"<html><body>Please sign in to continue</body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _page

    def log_message(self, *args: object) -> None:
        pass


def test_a_foreign_answer_a_wrong_url_or_endpoint_is_one_line_naming_the_setting(remote):
    """A 200 of HTML (a proxy's login page), a base_url without /v1 (404) and an endpoint the
    server does not run (400) each end in one line naming the setting to change, never "rerun
    to resume" (a rerun cannot fix them) and never a traceback."""
    server, d = remote
    login = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LoginPage)
    threading.Thread(target=login.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{login.server_address[1]}/v1"
        cases = {
            "html": (["--set", f"model.base_url='{base}'"],
                     f"model.base_url: {base} answered the upload (POST /files) with something that is not the "
                     "Batch API's JSON ('<html><body>Please sign in to continue</body></html>'...)"),
            "no-v1": (["--set", f"model.base_url='{server.url}'"], f"model.base_url: {server.url} has no POST /files (404)"),
            "endpoint": (["--set", "model.endpoint='/v1/chat/completions'"],
                         f"model.endpoint: the Batch API at {server.url}/v1 refused POST /v1/batches for /v1/chat/completions (400: "),
        }  # fmt: skip
        for name, (args, said) in cases.items():
            proc = cli(*job_args(server, f"out-{name}"), *args, cwd=d, env=env())
            last = proc.stderr.strip().splitlines()[-1]
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
            assert said in last and "rerun to resume" not in last, (name, last)
    finally:
        login.shutdown()
