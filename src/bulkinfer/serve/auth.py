"""API keys: ``serve.api_keys_file`` and the Bearer check (in constant time per key), with
optional per-key limits, reloaded on SIGHUP without a restart.

One key per line, ``#`` comments; after the key, optional ``id=NAME`` (what the audit log
and the metrics say instead of a hash of the key), ``rps=N`` (requests per second, uploads too),
``rows_per_s=N`` (rows per second) and ``file_bytes=N`` (the most bytes of files the key may
hold in the batch service at once)::

    sk-live-3f9a...   id=search-team  rps=20  rows_per_s=5000
    sk-live-77c1...   id=batch-backfill  file_bytes=2000000000

Limits are token buckets holding one second's worth: a burst up to the limit passes, then
requests get 429 with ``Retry-After`` (seconds until the bucket holds what was asked).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request

from ..core.errors import ConfigError
from .validation import ApiError

__all__ = ["ApiKey", "KeyRing", "key_id", "load_keys"]


def key_id(key: bytes) -> str:
    """What logs may say of a key without an ``id=``: the first 12 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(key).hexdigest()[:12]


@dataclass
class _Bucket:
    rate: float
    tokens: float
    clock: Callable[[], float] = time.monotonic
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.stamp = self.clock()

    def take(self, n: float) -> float:
        """Take ``n`` tokens; 0 when they were there, else the seconds until they will be. A
        request larger than a second's worth passes on a full bucket and leaves it in debt."""
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        need = min(n, self.rate)
        if need <= self.tokens:
            self.tokens -= n
            return 0.0
        return (need - self.tokens) / self.rate


@dataclass(frozen=True)
class ApiKey:
    secret: bytes
    id: str
    rps: float | None = None
    rows_per_s: float | None = None
    file_bytes: int | None = None


def _parse_line(path: str, n: int, line: str) -> ApiKey:
    secret, *options = line.split()
    values: dict[str, str] = {}
    for opt in options:
        name, eq, value = opt.partition("=")
        if not eq or name not in ("id", "rps", "rows_per_s", "file_bytes"):
            raise ConfigError(
                f"serve.api_keys_file: {path} line {n}: unknown option {opt!r} (id=, rps=, rows_per_s=, file_bytes=)"
            )
        values[name] = value
    try:
        rps = float(values["rps"]) if "rps" in values else None
        rows = float(values["rows_per_s"]) if "rows_per_s" in values else None
        files = int(values["file_bytes"]) if "file_bytes" in values else None
    except ValueError:
        raise ConfigError(f"serve.api_keys_file: {path} line {n}: rps, rows_per_s and file_bytes are numbers") from None
    if any(v is not None and v <= 0 for v in (rps, rows, files)):
        raise ConfigError(f"serve.api_keys_file: {path} line {n}: limits must be positive")
    key = secret.encode()
    return ApiKey(key, values.get("id") or key_id(key), rps, rows, files)


def load_keys(path: str | None) -> list[ApiKey]:
    """The keys in ``path`` (none: no key is asked for); a missing or empty file is a config error."""
    if path is None:
        return []
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"serve.api_keys_file: cannot read {path} ({exc.strerror or exc})") from exc
    keys = [
        _parse_line(path, n, line.strip())
        for n, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not keys:
        raise ConfigError(f"serve.api_keys_file: {path} holds no key (one per line)")
    return keys


class KeyRing:
    """The server's keys and their buckets (kept across a reload for the keys still there);
    ``clock``: where the buckets read the time (tests drive it by hand)."""

    def __init__(self, path: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.keys = load_keys(path)
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._lock = threading.Lock()

    def reload(self) -> int:
        """Read the keys file again (SIGHUP); a bad file keeps the keys in force. Returns the key count."""
        keys = load_keys(self.path)
        with self._lock:
            self.keys = keys
            ids = {k.id for k in keys}
            self._buckets = {b: v for b, v in self._buckets.items() if b[0] in ids}
        return len(keys)

    def authorize(self, request: Request) -> None:
        """Raise a 401 unless the request carries a key (no keys: everyone may call), a 429 when
        the key is over its request rate; the key is left in ``request.state`` for the audit log."""
        keys = self.keys
        if not keys:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode()
        match = None
        if scheme.lower() == "bearer":
            for k in keys:  # every key compared, in constant time each: no early exit to time
                if hmac.compare_digest(given, k.secret) and match is None:
                    match = k
        if match is None:
            raise ApiError(
                401, "missing or invalid API key (Authorization: Bearer <key>)", "unauthorized",
                {"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        request.state.key_id = match.id
        request.state.api_key = match
        if match.rps is not None:
            self._charge(match, "requests", match.rps, 1)

    def charge_rows(self, request: Request, rows: int) -> None:
        """A 429 when the request's rows put its key over ``rows_per_s``."""
        key: ApiKey | None = getattr(request.state, "api_key", None)
        if key is not None and key.rows_per_s is not None:
            self._charge(key, "rows", key.rows_per_s, rows)

    def _charge(self, key: ApiKey, what: str, rate: float, n: float) -> None:
        with self._lock:
            bucket = self._buckets.setdefault((key.id, what), _Bucket(rate, rate, self.clock))
            if bucket.rate != rate:  # the limit changed in a reload
                bucket.rate = rate
            wait = bucket.take(n)
        if wait > 0:
            limit = f"rps={rate:g}" if what == "requests" else f"rows_per_s={rate:g}"
            raise ApiError(
                429, f"key {key.id} is over its limit ({limit}); retry after {wait:.2f} s", "rate_limited",
                {"Retry-After": str(max(1, int(wait + 0.999)))},
            )  # fmt: skip
