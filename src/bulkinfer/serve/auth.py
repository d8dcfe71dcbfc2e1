"""API keys: ``serve.api_keys_file`` (one key per line) and the Bearer check, in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.requests import Request

from ..errors import ConfigError
from .validation import ApiError

__all__ = ["authorize", "load_keys"]


def load_keys(path: str | None) -> list[bytes]:
    """The keys in ``path`` (none: no key is asked for); a missing or empty file is a config error."""
    if path is None:
        return []
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"serve.api_keys_file: cannot read {path} ({exc.strerror or exc})") from exc
    keys = [line.strip().encode() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"serve.api_keys_file: {path} holds no key (one per line)")
    return keys


def key_id(key: bytes) -> str:
    """What logs may say of a key: the first 12 hex digits of its SHA-256, never the key."""
    import hashlib

    return "key-" + hashlib.sha256(key).hexdigest()[:12]


def authorize(request: Request, keys: list[bytes]) -> None:
    """Raise a 401 unless the request carries one of ``keys`` (no keys: everyone may call); the
    key's id is left in ``request.state.key_id`` for the audit log."""
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = token.strip().encode()
    match = next((k for k in keys if hmac.compare_digest(given, k)), None) if scheme.lower() == "bearer" else None
    if match is not None:
        request.state.key_id = key_id(match)
    else:
        raise ApiError(
            401, "missing or invalid API key (Authorization: Bearer <key>)", "unauthorized",
            {"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
