"""The finish step: a complete job's last writes, in order. Whatever a consumer reads beside
the parts comes first (an incremental run's deleted ids, an OpenAI batch's output and error
files, a video job's per-video summary, a top-K job's parts cut to its best K), ``_SUCCESS``
last: a reader that waits for ``_SUCCESS`` finds everything else in place."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..config import JobConfig
from ..core.records import ErrorRecord
from ..llm.batch_files import write_batch_files
from ..plan import JobPlan
from ..sinks.zarr import ARRAY_STORE
from .deleted import write_deleted
from .ledger import Commit, CommitTally, OutputLedger
from .topk import Best, keep_best
from .videos import write_video_summary

__all__ = ["batch_answers", "finish"]


def finish(cfg: JobConfig, previous: str | None, plan: JobPlan, ledger: OutputLedger, report: dict[str, Any]) -> None:
    """Write what a complete output holds besides its parts, then ``_SUCCESS``. ``previous``:
    the previous output of an incremental run, as the job asked for it (the settle step may
    have dropped it from ``cfg`` when nothing could be reused; the deletions are still listed)."""
    extra = write_deleted(previous, cfg, plan, ledger, report) if previous else {}
    if cfg.sink.format == "openai-batch":
        batch_answers(ledger, ledger.commits(), plan.input_errors)
    if any(f.format == "video" for f in plan.inputs):
        write_video_summary(ledger, [c.file for c in ledger.commits() if c.file])
    if cfg.sink.format == "zarr":  # the answers' arrays, beside the per-tile parts (sinks.zarr)
        extra = {**extra, "array": ARRAY_STORE}
    best = Best.of(cfg.sink.top_k, cfg.source.id_column)
    restated = None
    if best is not None:  # the parts hold each shard's best K: cut them to the job's
        commits = [c for c in ledger.commits() if c.file]
        restated, ranking = keep_best(best, ledger, [c.file for c in commits], cfg.sink.format, cfg.sink.compression)
        extra = {**extra, "top_k": {**ranking, "candidates": sum(c.rows for c in commits)}}
    ledger.write_success(plan.fingerprint, len(plan.input_errors), extra, restated)


def batch_answers(ledger: OutputLedger, commits: Sequence[Commit], input_errors: Iterable[ErrorRecord]) -> None:
    """An OpenAI batch's output and error files from ``commits``: the committed parts, and the
    error files no --retry-errors commit superseded, both in shard order."""
    parts = sorted(c.file for c in commits if c.file)
    in_force = CommitTally.of(commits, names=False, ranges=False).active_error_files()
    write_batch_files(ledger, parts, in_force, input_errors)
