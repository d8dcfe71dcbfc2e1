"""Credentials are never written down: what bulkinfer stores of a config (``job.json``'s
config and identity) or prints of a target has the passwords in URLs and DSNs, and the
secret-named storage options, replaced by a marker. A config read back from ``job.json``
(``--retry-errors``) that still holds a marker is refused, naming the field to give again."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "find_masked", "redact_url", "scrub"]

MASK = "<redacted>"
# the names fsspec's stores give their credentials (s3fs key/secret/token, gcsfs token,
# adlfs account_key/sas_token/connection_string, ...), and any password
_SECRET_NAME = re.compile(r"pass|secret|token|key|credential|connection_string|signature|sas", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^/@\s]+@", re.IGNORECASE)
_DSN_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The url without its user and password (for a target's name in logs and reports)."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def _scrub_text(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _DSN_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


def scrub(value: Any, *, options: bool = False) -> Any:
    """``value`` (a config as JSON) with every credential masked: passwords in URLs and
    ``password=`` in DSNs anywhere, and, inside a ``storage_options`` mapping, every entry
    whose name says it is a secret (at any depth: ``client_kwargs`` too)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            inner = options or k == "storage_options"
            if options and isinstance(k, str) and _SECRET_NAME.search(k) and isinstance(v, str | bytes) and v:
                out[k] = MASK
            else:
                out[k] = scrub(v, options=inner)
        return out
    if isinstance(value, list):
        return [scrub(v, options=options) for v in value]
    if isinstance(value, str):
        return _scrub_text(value)
    return value


def find_masked(value: Any, where: str = "") -> str | None:
    """The dotted name of the first field holding a masked credential, or None."""
    if isinstance(value, dict):
        for k, v in value.items():
            if (found := find_masked(v, f"{where}.{k}" if where else str(k))) is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (found := find_masked(v, f"{where}[{i}]")) is not None:
                return found
    elif isinstance(value, str) and MASK in value:
        return where
    return None
