"""Where shards run. ``local`` today (this process, threads for I/O); ``ray`` next."""

from __future__ import annotations

from .local import LocalRunner, ShardOutput

__all__ = ["LocalRunner", "ShardOutput"]
