"""The sink lifecycle (the shape of Ray Data's ``Datasink``), and what it hands back.

::

    start()                      once, before any inference: the output can be written
    stage(shard output)          a finished shard's files, durable under hidden names
    publish(staged)              the files under their final names (then the ledger line)
    reveal(staged)               after the ledger line (object stores: the part becomes visible)
    discard(staged)              an attempt that will not be committed (it lost a race)
    withdraw(staged, published)  a published shard whose commit will not come (an export failed)
    complete() / failed()        once, at the end: sweep what no commit needs

Only the ledger decides what is committed: a published file that no ledger line vouches
for is removed by the next run, so a crash between publish and the ledger line means
the shard runs again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..sources import Shard
    from ..sources.shard import ShardOutput

__all__ = ["Part", "Published", "Sink", "Staged", "StagedOutput"]


@dataclass(frozen=True)
class Part:
    """A file written and in place under its final name (not yet in the ledger)."""

    name: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Staged:
    """A file written and made durable under a hidden temporary name, not yet in place."""

    temp: str
    part: Part


@dataclass(frozen=True)
class StagedOutput:
    """A finished shard's part and error file, staged and not yet committed: what a Ray
    worker hands back to the driver, which alone publishes and commits."""

    shard: Shard
    part: Staged | None
    errors: Staged | None
    failed: int
    first_error: str | None
    unit: str = ""  # the part's name without extension, even when it has no rows: what route targets key on
    stats: dict[str, Any] | None = None  # the part's column statistics (report.columns.describe)


@dataclass(frozen=True)
class Published:
    """A shard's files in place: the part (None when no row succeeded) and the error file's name."""

    part: Part | None
    error_file: str | None


class Sink(Protocol):
    """Where a job's result files go."""

    out_dir: Any

    def start(self) -> None: ...

    def stage(self, out: ShardOutput, start: int | None, tag: str = "", name: str | None = None) -> StagedOutput:
        """``start`` is the first row when ``out`` is a tail of its planned shard (it names the file);
        ``name`` replaces the usual name (``--retry-errors`` parts)."""
        ...

    def publish(self, staged: StagedOutput) -> Published:
        """Put the staged files in place, before the ledger line (a folder: rename them)."""
        ...

    def publish_many(self, staged: Sequence[StagedOutput]) -> list[Published]:
        """:meth:`publish` for several shards committed together (a folder: one directory fsync for
        all); when one fails, those before it are withdrawn and the error goes on."""
        ...

    def reveal(self, staged: StagedOutput) -> None:
        """After the ledger line: make the committed part visible where ``publish`` could not do it
        without showing an uncommitted part (an object store copies it into place; a resume rolls a
        commit whose part is not yet in place forward). A folder has nothing left to do."""
        ...

    def discard(self, staged: StagedOutput) -> None: ...

    def withdraw(self, staged: StagedOutput, published: Published) -> None:
        """Take back what :meth:`publish` put in place, before the ledger line was written (an
        export target refused the shard): nothing visible is left without its commit."""
        ...

    def complete(self) -> None: ...

    def failed(self) -> None: ...
