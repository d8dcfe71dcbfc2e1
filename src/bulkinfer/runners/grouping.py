"""How many shards a cluster backend hands one worker in one call, and the queue it takes
them from.

A call has a fixed cost on the driver (a Ray task's round trip and bookkeeping, about a
millisecond of the driver's CPU; a Spark job's scheduling, tens of milliseconds, more on a
busy driver). With shards of seconds each it is nothing; with shards of a few milliseconds it
is what limits the job. So a call takes several shards when they are fast: as many as fill
about :data:`CALL_S` of a worker's time, as the worker measured its own time on the calls so
far (the round trip left out: a fixed cost must not make calls smaller), never more than
:data:`MOST`, and never more than half a worker's share of the shards still waiting (the
queue's tail is shared out, not taken by the first worker to ask). The first calls take one
shard each: nothing is measured yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..sources import Shard

__all__ = ["CALL_S", "MOST", "Grouper", "ShardQueue"]

CALL_S = 0.5
"""A call's target length in seconds: its fixed cost is small beside it, and a worker lost
mid-call costs at most this much work twice."""

MOST = 64
"""The most shards in one call."""


@dataclass
class Grouper:
    """The group size for the next call, from the seconds per shard the calls so far took."""

    call_s: float = CALL_S
    most: int = MOST
    shard_s: float | None = None
    """A worker's seconds per shard, a moving average over calls (round trips left out)."""

    def observe(self, seconds: float, shards: int) -> None:
        """A call of ``shards`` shards took the worker ``seconds``."""
        if shards < 1 or seconds < 0:
            return
        per = seconds / shards
        self.shard_s = per if self.shard_s is None else 0.7 * self.shard_s + 0.3 * per

    def size(self, waiting: int, workers: int) -> int:
        """How many of the ``waiting`` shards the next call takes, with ``workers`` sharing them."""
        if self.shard_s is None or waiting < 1:
            return 1
        share = waiting // (2 * max(1, workers))
        fill = int(self.call_s / max(self.shard_s, 1e-9))
        return max(1, min(fill, share, self.most))


class ShardQueue:
    """The shards waiting to be handed out: those put back first (a lost worker's, re-queued at
    the front), then the job's own in order, taken one at a time from its table (a million
    shards are not a million objects up front), then the split-off tails put at the back."""

    def __init__(self, shards: Sequence[Shard] = ()) -> None:
        self._front: deque[Shard] = deque()
        self._rest = iter(shards)
        self._left = len(shards)
        self._back: deque[Shard] = deque()

    def __len__(self) -> int:
        return len(self._front) + self._left + len(self._back)

    def popleft(self) -> Shard:
        if self._front:
            return self._front.popleft()
        if self._left:
            self._left -= 1
            return next(self._rest)
        return self._back.popleft()

    def extendleft(self, shards: Iterable[Shard]) -> None:
        """Put ``shards`` at the front, in their order."""
        self._front.extendleft(reversed(list(shards)))

    def append(self, shard: Shard) -> None:
        self._back.append(shard)
