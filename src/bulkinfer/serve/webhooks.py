"""Batch events to ``serve.webhook_url``, signed as the Standard Webhooks spec says.

Each event is written to ``<serve.batches>/webhooks/`` first and POSTed from a thread of its
own, so a receiver that is down never blocks a batch: a failed delivery is tried again with
backoff (1 s doubling to 5 min) until the receiver answers 2xx, across restarts too. The body
is OpenAI's event, ``{"id", "object": "event", "type": "batch.completed", "created_at",
"data": {"id": "batch_..."}}``; the headers ``webhook-id`` (the event's id: a receiver drops a
repeat), ``webhook-timestamp`` and ``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 of
``id.timestamp.body`` under the secret, signed when sent)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.threads import thread
from .files import write_json

__all__ = ["Webhooks", "sign"]

log = logging.getLogger("bulkinfer")

EVENTS = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
MAX_BACKOFF_S = 300.0


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        raise ConfigError("serve.webhook_secret: not a Standard Webhooks secret (whsec_ + base64)") from None


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header of one delivery."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


class Webhooks:
    """Queued, signed, retried event deliveries (a no-op without ``url``)."""

    def __init__(self, url: str | None, secret: str | None, root: Path, timeout_s: float = 10.0) -> None:
        if url and not secret:
            raise ConfigError("serve.webhook_url needs serve.webhook_secret (whsec_...) to sign the events with")
        if secret:
            _key(secret)
        self.url, self.secret, self.timeout_s = url, secret, timeout_s
        self.dir = root / "webhooks"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    def start(self) -> None:
        if self.url:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._thread = thread(self._loop, name="bulkinfer-webhooks")
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)

    def emit(self, event: str, batch_id: str) -> None:
        """Queue ``event`` about ``batch_id`` (once: an event queued already is not queued again);
        it is sent from the delivery thread. Its id is the batch's and the event's, so a receiver
        drops a repeat sent after a restart."""
        if not self.url:
            return
        event_id = "evt_" + hashlib.sha256(f"{batch_id}:{event}".encode()).hexdigest()[:24]
        if any(self.dir.glob(f"*-{event_id}.json")):
            return
        body = {
            "id": event_id, "object": "event", "type": event,
            "created_at": int(time.time()), "data": {"id": batch_id},
        }  # fmt: skip
        write_json(self.dir / f"{time.time_ns():020d}-{body['id']}.json", {"event": body, "attempts": 0})
        self._wake.set()

    def _loop(self) -> None:
        delay: dict[str, float] = {}  # pending file -> when to try it next
        while not self._stop.is_set():
            now = time.monotonic()
            for path in sorted(self.dir.glob("*.json")):
                if delay.get(path.name, 0.0) > now or self._stop.is_set():
                    continue
                pending = json.loads(path.read_text())
                if self._send(pending["event"]):
                    path.unlink(missing_ok=True)
                    delay.pop(path.name, None)
                    self.delivered += 1
                    continue
                pending["attempts"] += 1
                write_json(path, pending)
                delay[path.name] = now + min(MAX_BACKOFF_S, 2.0 ** (pending["attempts"] - 1))
            waits = [t - time.monotonic() for t in delay.values()]
            self._wake.wait(max(0.05, min(waits)) if waits else None)
            self._wake.clear()

    def _send(self, event: dict[str, Any]) -> bool:
        assert self.url and self.secret
        body = json.dumps(event, separators=(",", ":")).encode()
        stamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": event["id"],
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(self.secret, event["id"], stamp, body),
        }
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                ok = 200 <= response.status < 300
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.info("webhook %s for %s not delivered (%s); will retry", event["type"], event["data"]["id"], exc)
            return False
        return ok
