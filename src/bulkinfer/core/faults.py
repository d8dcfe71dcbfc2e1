"""Named crash points for fault-injection tests.

``BULKINFER_CRASH_AT=point[:n]`` makes the process SIGKILL itself the n-th time (default
1st) it reaches ``point``. Unset (always, outside tests) it costs one dict lookup.
Points: ``part-temp-written`` (temp file fsynced, not yet renamed), ``part-renamed``
(renamed, not yet exported), ``exported`` (export targets written, ledger line not yet
appended), ``export-postgres-copied`` (rows copied, the transaction not yet committed),
``success-temp-written`` (``_SUCCESS`` temp
written, not yet renamed).

``BULKINFER_IO_ERROR=point:errno[:n]`` makes the n-th (default 1st, and every later)
arrival at ``point`` raise the ``OSError`` of that errno name, as the OS would: the tests
of disk-full and read-only output use it where no tmpfs can be mounted. Points:
``part-write`` (a part's bytes written to its temp file), ``output-mkdir`` (the output
directory created).
"""

from __future__ import annotations

import errno
import os
import signal
from collections import Counter

__all__ = ["crash_point", "io_point"]

_hits: Counter[str] = Counter()


def _arrival(variable: str, name: str) -> tuple[int, str] | None:
    """When ``variable`` names the point ``name``: how many times it was reached (this one
    included) and the rest of the spec after ``name:``; None otherwise (one dict lookup)."""
    spec = os.environ.get(variable)
    if not spec:
        return None
    point, _, rest = spec.partition(":")
    if point != name:
        return None
    _hits[f"{variable}:{name}"] += 1
    return _hits[f"{variable}:{name}"], rest


def crash_point(name: str) -> None:
    arrived = _arrival("BULKINFER_CRASH_AT", name)
    if arrived is not None and arrived[0] == int(arrived[1] or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def io_point(name: str) -> None:
    arrived = _arrival("BULKINFER_IO_ERROR", name)
    if arrived is None:
        return
    code, _, nth = arrived[1].partition(":")
    if arrived[0] >= int(nth or 1):
        number = getattr(errno, code)
        raise OSError(number, os.strerror(number))
