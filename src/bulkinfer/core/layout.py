"""Names in an output's layout that more than one stage reads or writes."""

from __future__ import annotations

__all__ = ["HASH_COLUMN"]

HASH_COLUMN = "_input_hash"
"""Each row's input hash (``sink.input_hash``; always in an incremental run's output)."""
