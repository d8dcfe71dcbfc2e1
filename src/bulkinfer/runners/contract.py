"""The runner contract: where shards run. ``local`` (this process, threads joined by
bounded queues) and ``ray`` (actors on a cluster) both implement :class:`Runner`, and the
job calls every runner the same way::

    runner.start(gate)          set the model up (or join the cluster), run the quality gate
    runner.run(shards, commit)  each finished shard goes to ``commit`` exactly once
    runner.close()              release the model, the workers, the cluster

A runner never decides what is committed: it hands each finished shard to the
committer, which stages, publishes and appends the ledger line.

**The shard-split protocol** (a straggler's tail goes to an idle worker; the Ray driver
speaks it to each worker's local runner, :class:`Splittable`): ``progress()`` gives, per
shard being read, the first row not yet handed on to the model; ``split(index, at, stop)``
asks shard ``index`` to end at row ``at``. The runner accepts the later of ``at`` and its
next unread row, stops reading there, finishes (and commits) the rows before it as the
shard, and answers that row; the caller then owns the rows from it to ``stop`` as a new
shard. None means too late (the shard is read, or nearly). Rows already handed on are never
moved, so no row is inferred twice, and the two parts' names come from their first rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..sources.shard import ShardOutput

if TYPE_CHECKING:
    import pyarrow as pa

    from ..commit.committer import PartStamp
    from ..precision.gate import GateFigures, GateVerdict
    from ..report import RunStats
    from ..sinks import StagedOutput
    from ..sources import Shard

__all__ = [
    "BatchTimeout", "Committing", "Emit", "Gate", "Pass", "PassesTogether", "Runner", "ShardOutput", "Splittable",
    "publish_results",
]  # fmt: skip

Emit = Callable[[ShardOutput], None]
"""Takes a finished shard (the local runner calls it from its writer thread)."""


class BatchTimeout(Exception):
    """A model call did not return within ``runtime.batch_timeout_s``."""


class Gate(Protocol):
    """Runs the job's quality gate; ``figures_of`` computes its figures elsewhere (a cluster
    node with the job's device) instead of with this process's model. Returns the verdict: the
    figures, and the sample rows with their results when this process computed them (output
    rows a runner with the same model may take instead of inferring them again)."""

    def __call__(self, figures_of: GateFigures | None = None) -> GateVerdict: ...


class Committing(Protocol):
    """What a runner hands finished shards to (:class:`~bulkinfer.commit.committer.Committer`)."""

    def __call__(self, out: ShardOutput) -> None:
        """Stage, publish and commit a shard finished in this process."""
        ...

    def name_start(self, shard: Shard) -> int | None:
        """The row that names ``shard``'s files (None: a whole planned shard)."""
        ...

    @property
    def stamp(self) -> PartStamp:
        """What a part staged elsewhere (a Ray worker) must carry: statistics and provenance."""
        ...

    def publish(
        self, staged: StagedOutput, table: pa.Table | None = None, routed: Mapping[str, pa.Table] | None = None
    ) -> None:
        """Commit a shard another process staged (``table``: its rows, for export targets;
        ``routed``: each route's rows, for the routes' targets)."""
        ...

    @property
    def groups(self) -> bool:
        """Whether shards may be committed together (:meth:`publish_many`: no export targets, no routes)."""
        ...

    def publish_many(self, staged: Sequence[StagedOutput]) -> None:
        """Commit several shards staged elsewhere at once: one directory fsync and one ledger append."""
        ...

    def discard(self, staged: StagedOutput) -> None:
        """Drop a staged attempt whose rows another attempt committed."""
        ...


class Runner(Protocol):
    on_progress: Callable[[], None]

    def start(self, gate: Gate) -> GateVerdict:
        """Get ready to run (model set up, cluster joined); ``gate`` runs the quality gate
        where the model is set up, before any row is written. Returns its verdict."""
        ...

    def run(self, shards: Sequence[Shard], commit: Committing, rows: frozenset[int] | None = None) -> None:
        """Run ``shards`` (only ``rows`` of them when given) until each is committed, or
        until the job's stop event is set (after committing what was read)."""
        ...

    def close(self) -> None: ...


Pass = tuple["Sequence[Shard]", Committing, "frozenset[int] | None"]
"""Shards, their committer and the rows of them to run (None: all): what ``run`` takes."""


@runtime_checkable
class PassesTogether(Protocol):
    """A runner that takes several passes at once (``--retry-errors``' one per error file): the
    remote Batch API, where running them one after another costs one completion window each."""

    def run_passes(self, passes: Sequence[Pass]) -> None: ...


class Splittable(Protocol):
    """A runner whose shards can be split while they run (the protocol above)."""

    def progress(self) -> dict[int, int]:
        """The first row not yet handed on, of each shard being read."""
        ...

    def split(self, index: int, at: int, stop: int) -> int | None:
        """End shard ``index`` at ``at`` or its first row not yet read, whichever is later;
        that row, or None when it is too late. The caller owns the rows from there to ``stop``."""
        ...


def publish_results(commit: Committing, results: Sequence[Mapping[str, Any]], stats: RunStats) -> None:
    """Commit what a worker staged (a call's or task's shards, together when the job allows) and
    merge the workers' figures (a call's ride on its last result)."""
    if commit.groups and len(results) > 1:
        commit.publish_many([r["staged"] for r in results])
    else:
        for r in results:
            commit.publish(r["staged"], r["table"], r["routed"])
    for r in results:
        if r["figures"] is not None:
            stats.merge(r["figures"])
