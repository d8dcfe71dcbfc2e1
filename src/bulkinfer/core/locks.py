"""Exclusive locks on a file (``flock``): one process at a time, released by the kernel when
the process dies, so a lock left by a killed process is free to take."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

__all__ = ["try_lock"]


def try_lock(path: Path) -> tuple[IO[str] | None, str]:
    """Take ``path``'s lock: ``(handle, what the last holder wrote)``, or ``(None, what the
    live holder wrote)`` when another process holds it. Keep the handle open while holding."""
    fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held by the caller
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip()
        fh.close()
        return None, holder
    fh.seek(0)
    return fh, fh.read().strip()
