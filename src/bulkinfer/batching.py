"""Group rows into model calls: pure functions, property-tested.

Rows are sorted by cost (token length) inside windows of ``window`` consecutive rows,
so rows of similar length share a batch and padding stays small; a batch closes when
it reaches ``max_rows`` rows or when its padded size (rows x longest row) would exceed
``max_tokens``. A row longer than ``max_tokens`` goes alone. Results are scattered back
to input order with :func:`restore_order`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["plan_batches", "restore_order"]


def plan_batches(
    costs: Sequence[int] | None,
    n_rows: int,
    max_rows: int,
    max_tokens: int | None = None,
    window: int | None = None,
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


def restore_order(batches: Sequence[np.ndarray], n_rows: int) -> np.ndarray:
    """The permutation that puts concatenated batch outputs back into input order.

    ``outputs_in_batch_order[restore_order(batches, n)]`` is in input order.
    """
    flat = np.concatenate(list(batches)) if batches else np.empty(0, dtype=np.int64)
    if len(flat) != n_rows:
        raise ValueError("batches do not cover every row exactly once")
    inverse = np.empty(n_rows, dtype=np.int64)
    inverse[flat] = np.arange(n_rows)
    return inverse
