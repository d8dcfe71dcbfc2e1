"""Airflow: :class:`BulkinferOperator` runs a bulkinfer job as a task of a DAG.

::

    from bulkinfer.airflow import BulkinferOperator

    embed = BulkinferOperator(
        task_id="embed",
        job="/opt/jobs/catalog.toml",
        overrides={"source.paths": ["s3://catalog/{{ ds }}/*.parquet"], "sink.path": "s3://emb/{{ ds }}"},
    )

``job`` and ``overrides`` are templated. The job runs as ``bulkinfer run`` in a child process
(:mod:`bulkinfer.orchestrate`). A bad job file or override fails the task at once, without retries.
Exit 75 (the job was stopped: the task was killed or its worker drained; committed rows are kept)
fails this try with a retry, and the retry resumes from the output's ledger, so the operator
asks for 3 retries unless ``retries`` is given. The run's ``report.json`` is the task's XCom
(``return_value``): rows, time, cost, the output's path. Killing the task sends the job SIGTERM
and gives it ``stop_grace_s`` to commit before SIGKILL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from .core.errors import BulkinferError
from .orchestrate import JobProcess

__all__ = ["BulkinferOperator"]


class BulkinferOperator(BaseOperator):
    """Run (or resume) the bulkinfer job ``job`` with ``overrides`` (dotted keys: ``sink.path``)."""

    template_fields: Sequence[str] = ("job", "overrides")
    ui_color = "#d9ecf2"

    def __init__(
        self,
        *,
        job: str,
        overrides: Mapping[str, Any] | None = None,
        python: str | None = None,
        stop_grace_s: float = 120.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("retries", 3)  # a stopped run (exit 75) resumes on the next try
        super().__init__(**kwargs)
        self.job = job
        self.overrides = dict(overrides or {})
        self.python = python
        self.stop_grace_s = stop_grace_s
        self._process: JobProcess | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            self._process = JobProcess(self.job, self.overrides, self.python)
        except BulkinferError as exc:  # retrying cannot fix a config
            raise AirflowFailException(f"bulkinfer: {exc}") from None
        outcome = self._process.run(self.log.info)
        if outcome.stopped:
            raise AirflowException(
                f"bulkinfer: the job was stopped (exit 75) with its committed rows kept in {outcome.output}; "
                "the next try resumes it"
            )
        if outcome.returncode != 0:
            raise AirflowException(
                f"bulkinfer: the job failed (exit {outcome.returncode}); its log is above, committed rows are kept"
            )
        return {**(outcome.report or {}), "output": outcome.output}

    def on_kill(self) -> None:
        if self._process is not None:
            self._process.stop(self.stop_grace_s)
