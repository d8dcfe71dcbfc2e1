"""Dagster: :func:`bulkinfer_asset` makes a bulkinfer job an asset whose materialization runs it.

::

    from bulkinfer.dagster import bulkinfer_asset

    catalog_embeddings = bulkinfer_asset(job="jobs/catalog.toml", deps=["catalog"])

The materialization runs ``bulkinfer run`` in a child process (:mod:`bulkinfer.orchestrate`) and
records the run as the materialization's metadata: rows written (this run and before), failed rows,
rows/s, the run's cost, and the output's path. A bad job file fails at once, without retries; a
stopped run (exit 75: committed rows kept) asks Dagster for a retry, which resumes; a run whose
step is interrupted sends the job SIGTERM and gives it ``stop_grace_s`` to commit first.
"""

# no ``from __future__ import annotations``: Dagster reads the context parameter's annotation as a class
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, AssetsDefinition, Failure, MaterializeResult, MetadataValue, RetryRequested
from dagster import asset as dagster_asset

from .core.errors import BulkinferError
from .orchestrate import JobProcess

__all__ = ["bulkinfer_asset"]


def bulkinfer_asset(
    *,
    job: str | Path,
    name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    python: str | None = None,
    max_retries: int = 3,
    stop_grace_s: float = 120.0,
    **asset_kwargs: Any,
) -> AssetsDefinition:
    """An asset named ``name`` (default: the job file's name) materialized by running ``job``;
    ``asset_kwargs`` go to Dagster's ``@asset`` (``deps``, ``group_name``, ``key_prefix``...)."""
    asset_name = name or re.sub(r"\W", "_", Path(job).stem)

    @dagster_asset(name=asset_name, kinds={"bulkinfer"}, **asset_kwargs)
    def run(context: AssetExecutionContext) -> MaterializeResult:
        try:
            process = JobProcess(job, overrides, python)
        except BulkinferError as exc:  # retrying cannot fix a config
            raise Failure(description=f"bulkinfer: {exc}", allow_retries=False) from None
        try:
            outcome = process.run(context.log.info)
        except BaseException:  # the step was interrupted: the job commits what is in flight
            process.stop(stop_grace_s)
            raise
        if outcome.stopped:
            context.log.warning(f"bulkinfer: stopped (exit 75), committed rows kept in {outcome.output}; retrying")
            raise RetryRequested(max_retries=max_retries)
        if outcome.returncode != 0:
            raise Failure(description=f"bulkinfer: the job failed (exit {outcome.returncode}); see the step's log")
        return MaterializeResult(metadata=_metadata(outcome.report or {}, outcome.output))

    return run


def _metadata(report: Mapping[str, Any], output: str) -> dict[str, Any]:
    cost = report.get("cost", {})
    return {
        "output": MetadataValue.path(output),
        "rows": report.get("rows_out", 0),
        "rows_already_done": report.get("rows_already_done", 0),
        "rows_failed": report.get("rows_failed", 0),
        "rows_per_s": report.get("rows_per_s", 0.0),  # rows the model ran per second
        "rows_written_per_s": report.get("rows_written_per_s", report.get("rows_per_s", 0.0)),
        "cost": cost.get("run", 0.0),
        "currency": cost.get("currency", ""),
        "report": MetadataValue.path(f"{output}/_bulkinfer/report.json"),
    }
