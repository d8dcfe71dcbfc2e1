"""The audit log of ``bulkinfer serve`` (``serve.audit_log``): one JSON line per request —
time, API key id (a hash prefix, never the key), route, rows, status, latency, client —
and one per file or batch event (key id, event, the object's id and counts), to a file
rotated by size (five old files kept), or to stderr with ``"-"``. Content is never written."""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from datetime import UTC, datetime
from typing import Any

from ..core.errors import ConfigError

__all__ = ["AuditLog"]


class AuditLog:
    """Writes audit lines (a no-op when ``where`` is None)."""

    def __init__(self, where: str | None, max_bytes: int) -> None:
        self.logger: logging.Logger | None = None
        if where is None:
            return
        logger = logging.getLogger(f"bulkinfer.audit.{id(self)}")
        logger.setLevel(logging.INFO)
        logger.propagate = False  # audit lines go to the audit log only
        try:
            handler: logging.Handler = (
                logging.StreamHandler(sys.stderr)
                if where == "-"
                else logging.handlers.RotatingFileHandler(where, maxBytes=max_bytes, backupCount=5, encoding="utf-8")
            )
        except OSError as exc:
            raise ConfigError(f"serve.audit_log: cannot open {where} ({exc.strerror or exc})") from exc
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        self.logger = logger

    def record(self, request: Any, route: str, status: int, seconds: float) -> None:
        if self.logger is None:
            return
        state = request.state
        line = {
            "time": _now(),
            "key_id": getattr(state, "key_id", None),
            "route": route,
            "method": request.method,
            "rows": getattr(state, "rows", None),
            "status": status,
            "latency_ms": round(seconds * 1000, 2),
            "client": request.client.host if request.client else None,
        }
        self.logger.info(json.dumps(line, separators=(",", ":")))

    def event(self, key_id: str | None, event: str, object_id: str, **figures: Any) -> None:
        """One line for a file or batch event (``batch.created``, ``file.deleted``...): the key
        id, the object's id and counts, never content."""
        if self.logger is None:
            return
        line = {
            "time": _now(),
            "key_id": key_id,
            "event": event,
            "id": object_id,
            **figures,
        }
        self.logger.info(json.dumps(line, separators=(",", ":")))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
