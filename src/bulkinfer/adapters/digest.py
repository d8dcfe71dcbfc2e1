"""Model digests: a hash that changes when the model changes and costs O(files), part of every
key that names something built from or measured on a model (the plan's identity, the compiled
model, tune's results)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

__all__ = ["custom_digest", "digest_path"]

_HASH_SPAN = 1 << 20


def digest_path(path: Path) -> str:
    """Hash of each file's name, size, head and tail: changes when the model changes, costs O(files)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if path.is_dir() else f.name}:{size}\n".encode())
        with f.open("rb") as fh:
            h.update(fh.read(_HASH_SPAN))
            if size > 2 * _HASH_SPAN:
                fh.seek(size - _HASH_SPAN)
                h.update(fh.read(_HASH_SPAN))
    return h.hexdigest()[:32]


def custom_digest(spec: str) -> str:
    module = spec.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not Path(found.origin).is_file():
        return hashlib.sha256(spec.encode()).hexdigest()[:32]
    return digest_path(Path(found.origin))
