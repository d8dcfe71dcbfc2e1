"""The batch service's parts on their own: the file store (owners, limits, expiry, restart),
cursor pages, the whole-file checks of a batch, the files of a batch stopped before its end,
and webhook signatures and retries (a real HTTP receiver on loopback)."""

from __future__ import annotations

import http.server
import io
import json
import threading
import time

import pytest
from standardwebhooks import Webhook

from bulkinfer.core.errors import ConfigError
from bulkinfer.serve.batch_jobs import stopped_files, validate
from bulkinfer.serve.files import FileStore, page
from bulkinfer.serve.validation import ApiError
from bulkinfer.serve.webhooks import Webhooks, sign

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_files_belong_to_their_owner_survive_a_restart_and_go_when_expired(tmp_path):
    store = FileStore(tmp_path)
    kept = store.upload(io.BytesIO(b"x" * 100), filename="a.jsonl", purpose="batch", owner="alice", max_bytes=100)
    assert store.get(kept.id, "alice").bytes == 100 and store.path(kept).read_bytes() == b"x" * 100
    with pytest.raises(ApiError) as other:
        store.get(kept.id, "bob")
    assert other.value.status == 404
    with pytest.raises(ApiError) as big:
        store.upload(io.BytesIO(b"x" * 101), filename="b.jsonl", purpose="batch", owner="alice", max_bytes=100)
    assert big.value.status == 413 and big.value.param == "file"
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == [f"{kept.id}.data", f"{kept.id}.json"]
    gone = store.upload(io.BytesIO(b"y"), filename="c.jsonl", purpose="batch", owner="alice", max_bytes=9,
                        expires_at=int(time.time()) - 1)  # fmt: skip
    with pytest.raises(ApiError):
        store.get(gone.id, "alice")
    assert [f.id for f in store.owned_by("alice")] == [kept.id] and store.held_bytes("alice") == 100
    assert store.sweep() == 1 and not store.path(gone).exists()
    again = FileStore(tmp_path)  # a restart finds what was kept
    assert again.get(kept.id, "alice") == kept and again.owned_by("bob") == []


def test_cursor_pages_start_after_the_given_id_and_say_whether_more_follow():
    items = [{"id": f"b{i}"} for i in range(5)]
    first = page(items, None, 2)
    assert [i["id"] for i in first["data"]] == ["b0", "b1"] and first["has_more"] and first["last_id"] == "b1"
    last = page(items, "b2", 5)
    assert [i["id"] for i in last["data"]] == ["b3", "b4"] and not last["has_more"]
    with pytest.raises(ApiError) as bad:
        page(items, "nope", 2)
    assert bad.value.param == "after"


def line(cid: str, url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": {"input": "x"}})


def test_a_file_fails_as_a_whole_only_for_what_no_line_can_fix(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join([line("a"), "", "{broken", line("b", "/v1/chat/completions"), line("c")]) + "\n")
    total, errors = validate(f, "/v1/embeddings", 10)
    assert total == 4  # blank lines are not requests
    assert [(e["code"], e["line"], e["param"]) for e in errors] == [("mismatched_endpoint", 3, "url")]
    f.write_text(line("a") + "\n{broken\n")
    assert validate(f, "/v1/embeddings", 10) == (2, [])  # a broken line fails alone, later
    assert [e["code"] for e in validate(f, "/v1/embeddings", 1)[1]] == ["too_many_requests"]
    f.write_text("\n\n")
    assert [e["code"] for e in validate(f, "/v1/embeddings", 10)[1]] == ["empty_file"]
    f.write_text("1,2\n3,4\n")
    assert [e["code"] for e in validate(f, "/v1/embeddings", 10)[1]] == ["invalid_file_format"]


def test_a_batch_that_expired_before_it_ran_lists_every_request_as_batch_expired(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join([line("a"), "{broken", "", line("b")]) + "\n")
    out, err = stopped_files(tmp_path / "out", f, expired=True)
    assert out.read_text() == ""
    errors = [json.loads(x) for x in err.read_text().splitlines()]
    assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in errors] == [
        ("a", "batch_expired", None), (None, "batch_expired", None), ("b", "batch_expired", None),
    ]  # fmt: skip
    assert len({e["id"] for e in errors}) == 3
    _, err = stopped_files(tmp_path / "out2", f, expired=False)  # cancelled before it ran: nothing to say
    assert err.read_text() == ""


def test_a_signature_verifies_with_the_standard_webhooks_library_and_a_changed_body_does_not():
    body = b'{"type":"batch.completed"}'
    stamp = int(time.time())
    headers = {
        "webhook-id": "evt_1",
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign(SECRET, "evt_1", stamp, body),
    }
    assert Webhook(SECRET).verify(body, headers) == {"type": "batch.completed"}
    with pytest.raises(Exception, match="(?i)signature"):
        Webhook(SECRET).verify(body + b" ", headers)
    with pytest.raises(ConfigError, match="webhook_secret"):
        Webhooks("http://127.0.0.1:9/hook", None, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="whsec_"):
        sign("not base64!", "evt_1", stamp, body)


def test_a_delivery_that_fails_is_tried_again_with_the_same_id_and_a_fresh_signature(tmp_path):
    got: list[tuple[int, dict[str, str], bytes]] = []

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            status = 503 if not got else 200
            got.append((status, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    hooks = Webhooks(f"http://127.0.0.1:{httpd.server_port}/hook", SECRET, tmp_path)
    hooks.start()
    try:
        hooks.emit("batch.expired", "batch_1")
        deadline = time.monotonic() + 15
        while hooks.delivered < 1:
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
    finally:
        hooks.close()
        httpd.shutdown()
    assert [s for s, _, _ in got] == [503, 200]
    assert got[0][1]["webhook-id"] == got[1][1]["webhook-id"]
    event = Webhook(SECRET).verify(got[1][2], got[1][1])
    assert event["type"] == "batch.expired" and event["data"] == {"id": "batch_1"}
    assert list((tmp_path / "webhooks").glob("*.json")) == []  # delivered: nothing left to send


def test_an_event_queued_by_a_server_that_stopped_is_sent_by_the_next_and_once(tmp_path):
    """The first server queues an event its receiver cannot take and stops; the next start on
    the same state sends it, with the same id; queuing it again (a restart finishing the batch's
    end) adds nothing."""
    got: list[dict[str, str]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            got.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver, bind_and_activate=False)
    httpd.server_bind()  # bound, not listening: the first server's deliveries are refused
    url = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    first = Webhooks(url, SECRET, tmp_path)
    first.start()
    first.emit("batch.completed", "batch_9")
    deadline = time.monotonic() + 15
    while not any(json.loads(p.read_text())["attempts"] >= 1 for p in (tmp_path / "webhooks").glob("*.json")):
        assert time.monotonic() < deadline, "no delivery was tried"
        time.sleep(0.05)
    first.close()
    httpd.server_activate()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    second = Webhooks(url, SECRET, tmp_path)
    second.emit("batch.completed", "batch_9")  # the same event queued again: still one
    second.start()
    try:
        deadline = time.monotonic() + 15
        while second.delivered < 1:
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
        time.sleep(0.3)  # a second copy, were there one, would arrive now
    finally:
        second.close()
        httpd.shutdown()
    assert len(got) == 1 and got[0]["webhook-id"].startswith("evt_")
    assert list((tmp_path / "webhooks").glob("*.json")) == []
