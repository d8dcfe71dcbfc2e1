"""Group rows into model calls: pure functions, property-tested.

Rows are sorted by cost (token length) inside windows of ``window`` consecutive rows,
so rows of similar length share a batch and padding stays small; a batch closes when
it reaches ``max_rows`` rows or when its padded size (rows x longest row) would exceed
``max_tokens``. A row longer than ``max_tokens`` goes alone. Given ``call_overhead`` (what
one model call costs beyond its padded tokens, in tokens), the sorted rows are instead cut
where the total cost, calls x overhead + padded tokens, is least: rows of very different
lengths go in separate calls when padding them would cost more than the extra calls.
Results are scattered back to input order with :func:`restore_order`.
:func:`bisect_call` isolates the rows that make a call fail, in about log2(batch) extra
calls per bad row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["bisect_call", "plan_batches", "restore_order"]

T = TypeVar("T")


def plan_batches(
    costs: Sequence[int] | None,
    n_rows: int,
    max_rows: int,
    max_tokens: int | None = None,
    window: int | None = None,
    call_overhead: float | None = None,
) -> list[np.ndarray]:
    """Return batches as arrays of row indices into ``range(n_rows)``.

    ``costs`` (one per row, e.g. token counts) drives the sort and the token budget;
    without it, rows are taken in order, ``max_rows`` at a time.
    """
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    if costs is None:
        return [np.arange(s, min(s + max_rows, n_rows)) for s in range(0, n_rows, max_rows)]
    if len(costs) != n_rows:
        raise ValueError("costs must have one entry per row")
    lengths = np.asarray(costs, dtype=np.int64)
    window = window or max(n_rows, 1)
    batches: list[np.ndarray] = []
    for w0 in range(0, n_rows, window):
        w_idx = np.arange(w0, min(w0 + window, n_rows))
        order = w_idx[np.argsort(lengths[w_idx], kind="stable")]
        if call_overhead is not None:
            batches.extend(_least_cost_cuts(order, lengths[order], max_rows, max_tokens, call_overhead))
            continue
        start = 0
        longest = 0
        for pos, row in enumerate(order):
            size = pos - start
            cand = max(longest, int(lengths[row]))
            over_rows = size >= max_rows
            over_tokens = max_tokens is not None and size > 0 and cand * (size + 1) > max_tokens
            if over_rows or over_tokens:
                batches.append(order[start:pos])
                start, cand = pos, int(lengths[row])
            longest = cand
        if start < len(order):
            batches.append(order[start:])
    return batches


def _least_cost_cuts(
    order: np.ndarray, sorted_lengths: np.ndarray, max_rows: int, max_tokens: int | None, overhead: float
) -> list[np.ndarray]:
    """Cut rows sorted by length into calls of least total cost (dynamic programming:
    ``best[j]`` is the cheapest way to run the first ``j`` rows; a call of rows ``i..j-1``
    costs ``overhead + (j - i) * sorted_lengths[j - 1]``)."""
    n = len(order)
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        starts = np.arange(max(0, j - max_rows), j)
        padded = (j - starts) * sorted_lengths[j - 1]
        total = best[starts] + overhead + padded
        if max_tokens is not None:
            total[(padded > max_tokens) & (starts < j - 1)] = np.inf  # alone, a long row still runs
        k = int(np.argmin(total))
        best[j], cut[j] = total[k], starts[k]
    calls, j = [], n
    while j > 0:
        calls.append(order[cut[j] : j])
        j = int(cut[j])
    return calls[::-1]


def restore_order(batches: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Put batch outputs back in input order, allowing rows that failed (absent from ``batches``).

    Returns ``(rows, take)``: the surviving row indices ascending, and the permutation with
    which ``concatenated_batch_outputs.take(take)`` lines up with ``rows``.
    """
    flat = np.concatenate(list(batches)) if len(batches) else np.empty(0, dtype=np.int64)
    take = np.argsort(flat, kind="stable")
    rows = flat[take]
    if len(rows) > 1 and (np.diff(rows) == 0).any():
        raise ValueError("a row appears in two batches")
    return rows, take


def bisect_call(
    indices: np.ndarray,
    call: Callable[[np.ndarray], T],
    on_failure: Callable[[np.ndarray, BaseException], None] | None = None,
    *,
    known_bad: bool = False,
) -> tuple[list[tuple[np.ndarray, T]], list[tuple[int, BaseException]]]:
    """Call ``call(indices)``; when it raises, split in halves and retry until the failing
    rows are alone. Returns the successful (indices, result) pieces, in order, and the
    (row, exception) of every row that fails on its own. ``on_failure`` sees each failure
    (e.g. to shrink later batches after an out-of-memory error). ``known_bad``: the whole
    batch already failed, so start with its halves.
    """
    done: list[tuple[np.ndarray, T]] = []
    failed: list[tuple[int, BaseException]] = []
    indices = np.asarray(indices)
    mid = len(indices) // 2
    stack = [indices[mid:], indices[:mid]] if known_bad and len(indices) > 1 else [indices]
    while stack:
        part = stack.pop()
        if len(part) == 0:
            continue
        try:
            done.append((part, call(part)))
        except Exception as exc:
            if on_failure is not None:
                on_failure(part, exc)
            if len(part) == 1:
                failed.append((int(part[0]), exc))
            else:
                mid = len(part) // 2
                stack.append(part[mid:])
                stack.append(part[:mid])
    return done, failed


def take_spans(spans: Sequence[tuple[int, int]], indices: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Requests ``indices`` of requests that each own a span of rows: the rows they own, in order,
    and each one's span among those rows (a batch file's request of several inputs)."""
    flat = [i for r in indices for i in range(*spans[r])]
    taken, start = [], 0
    for r in indices:
        a, b = spans[r]
        taken.append((start, start + b - a))
        start += b - a
    return np.asarray(flat, dtype=np.int64), taken
