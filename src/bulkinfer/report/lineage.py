"""OpenLineage run events for a job: START once the plan is fixed, then COMPLETE, FAIL, or
ABORT when a signal stopped it (``lineage.url`` and/or ``lineage.file``).

The events say which inputs (files, with the input snapshot in the job fingerprint) and
which model (kind, location, digest, precision, engine: the ``bulkinfer_model`` job facet)
produced which output (its schema and, at the end, its row count, bytes and file count),
under the cost labels (job tags). They are sent with ``openlineage-python``'s own client and
transports. Lineage is an observer: a receiver that is down costs one warning line, never
the run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..adapters import ResolvedModel
    from ..config import JobConfig
    from ..plan import JobPlan

__all__ = ["Lineage", "dataset_name"]

log = logging.getLogger("bulkinfer")

_FACET_SCHEMA = "https://github.com/bulkinfer/bulkinfer/blob/main/docs/lineage-facets.json#/$defs/"
_MAX_INPUT_DATASETS = 100


def dataset_name(uri: str) -> tuple[str, str]:
    """OpenLineage's naming for a file or prefix: (``file``, absolute path) or (``s3://bucket``, key)."""
    import os

    scheme, sep, rest = uri.partition("://")
    if not sep or scheme == "file":
        return "file", os.path.abspath(rest if sep else uri)
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", "/" + key.rstrip("/") if key else "/"


def _facet_classes() -> tuple[Any, Any]:
    import attr
    from openlineage.client.generated.base import JobFacet, RunFacet

    @attr.define
    class BulkinferModelJobFacet(JobFacet):
        """The model a run used: enough to tell two runs' models apart."""

        kind: str
        location: str
        digest: str
        precision: str
        engine: str

        @staticmethod
        def _get_schema() -> str:
            return _FACET_SCHEMA + "BulkinferModelJobFacet"

    @attr.define
    class BulkinferRunFacet(RunFacet):
        """The run's job fingerprint (config, model and input snapshot) and its row counts."""

        fingerprint: str
        rowsPlanned: int  # OpenLineage spells it in camelCase
        rowsWritten: int | None = None
        rowsFailed: int | None = None

        @staticmethod
        def _get_schema() -> str:
            return _FACET_SCHEMA + "BulkinferRunFacet"

    return BulkinferModelJobFacet, BulkinferRunFacet


class Lineage:
    """Sends one run's events (nothing when neither ``lineage.url`` nor ``lineage.file`` is set)."""

    def __init__(self, cfg: JobConfig, plan: JobPlan, model: ResolvedModel, output: str) -> None:
        self.cfg, self.plan, self.model, self.output = cfg, plan, model, output
        self.run_id = str(uuid.uuid4())
        self.clients = self._clients() if cfg.lineage.url or cfg.lineage.file else []
        self._sent_end = False

    def _clients(self) -> list[tuple[str, Any]]:
        """One client per destination, so a receiver that is down does not cost the file its events."""
        from openlineage.client import OpenLineageClient
        from openlineage.client.transport.file import FileConfig, FileTransport
        from openlineage.client.transport.http import HttpConfig, HttpTransport

        lc = self.cfg.lineage
        clients: list[tuple[str, Any]] = []
        if lc.url:
            retry = {
                "total": 2,
                "backoff_factor": 0.2,
                "status_forcelist": [500, 502, 503, 504],
                "allowed_methods": ["POST"],
            }
            http = HttpTransport(HttpConfig(url=lc.url, endpoint=lc.endpoint, timeout=lc.timeout_s, retry=retry))
            clients.append((lc.url, OpenLineageClient(transport=http)))
        if lc.file:
            clients.append((lc.file, OpenLineageClient(transport=FileTransport(FileConfig(lc.file, append=True)))))
        return clients

    # -- events ------------------------------------------------------------------------------
    def start(self) -> None:
        self._emit("START")

    def complete(self, report: Mapping[str, Any], schema: Mapping[str, str]) -> None:
        self._emit("COMPLETE", report, schema)

    def fail(self, message: str, report: Mapping[str, Any] | None = None) -> None:
        self._emit("FAIL", report, message=message)

    def abort(self, report: Mapping[str, Any] | None = None) -> None:
        self._emit("ABORT", report)

    def _emit(
        self,
        state: str,
        report: Mapping[str, Any] | None = None,
        schema: Mapping[str, str] | None = None,
        message: str | None = None,
    ) -> None:
        if not self.clients or self._sent_end:
            return
        self._sent_end = state != "START"
        event = self.event(state, report, schema, message)
        for where, client in list(self.clients):
            try:
                client.emit(event)
            except Exception as exc:  # an observer: a receiver that is down must not fail the run
                why = " ".join(str(exc).split())[:200]
                log.warning(
                    "lineage: could not send the %s event to %s (%s); no more events go there in this run",
                    state, where, why,
                )  # fmt: skip
                self.clients.remove((where, client))  # one line for a receiver that is down, not one per event

    def event(
        self,
        state: str,
        report: Mapping[str, Any] | None = None,
        schema: Mapping[str, str] | None = None,
        message: str | None = None,
    ) -> Any:
        """The OpenLineage RunEvent of ``state`` (START, COMPLETE, FAIL, ABORT)."""
        from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
        from openlineage.client.generated import output_statistics_output_dataset, schema_dataset

        ns, name = dataset_name(self.output)
        out_facets: dict[str, Any] = {}
        if schema:
            out_facets["schema"] = schema_dataset.SchemaDatasetFacet(
                fields=[schema_dataset.SchemaDatasetFacetFields(name=c, type=t) for c, t in schema.items()]
            )
        output_facets: dict[str, Any] = {}
        if report is not None and state == "COMPLETE":
            output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=int(report.get("output_rows", report["rows_out"])),
                size=report.get("output_bytes"),
                fileCount=report.get("output_files"),
            )
        return RunEvent(
            eventType=getattr(RunState, state),
            eventTime=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            run=Run(runId=self.run_id, facets=self._run_facets(report, message)),
            job=Job(
                namespace=self.cfg.lineage.namespace,
                name=self.cfg.lineage.job_name or name.rsplit("/", 1)[-1] or name,
                facets=self._job_facets(),
            ),
            inputs=[InputDataset(namespace=n, name=p) for n, p in self._inputs()],
            outputs=[OutputDataset(namespace=ns, name=name, facets=out_facets, outputFacets=output_facets)],
        )

    def _run_facets(self, report: Mapping[str, Any] | None, message: str | None) -> dict[str, Any]:
        """The engine, bulkinfer's run figures, and a failure's message."""
        from openlineage.client.generated import error_message_run, processing_engine_run

        from .._version import __version__

        _model_facet, run_facet = _facet_classes()
        facets: dict[str, Any] = {
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(version=__version__, name="bulkinfer"),
            "bulkinfer_run": run_facet(
                fingerprint=self.plan.fingerprint,
                rowsPlanned=self.plan.rows,
                rowsWritten=None if report is None else int(report["rows_out"]),
                rowsFailed=None if report is None else int(report["rows_failed"]),
            ),
        }
        if message is not None:
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=message, programmingLanguage="python"
            )
        return facets

    def _job_facets(self) -> dict[str, Any]:
        """A batch job of bulkinfer's, the model it runs, and ``cost.labels`` as tags."""
        from openlineage.client.generated import job_type_job, tags_job

        model_facet, _run_facet = _facet_classes()
        cfg = self.cfg
        facets: dict[str, Any] = {
            "jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration="BULKINFER", jobType="JOB"),
            "bulkinfer_model": model_facet(
                kind=self.plan.model_kind,
                location=self.model.location,
                digest=self.model.digest,
                precision=cfg.runtime.precision,
                engine=cfg.runtime.engine,
            ),
        }
        if cfg.cost.labels:
            tags = [
                tags_job.TagsJobFacetFields(key=k, value=v, source="cost.labels") for k, v in cfg.cost.labels.items()
            ]
            facets["tags"] = tags_job.TagsJobFacet(tags=tags)
        return facets

    def _inputs(self) -> list[tuple[str, str]]:
        """Each input file; past 100 files, the folders they are in (a dataset is a table, not a shard)."""
        files = [dataset_name(f.uri) for f in self.plan.inputs]
        if len(files) <= _MAX_INPUT_DATASETS:
            return files
        return sorted({(ns, p.rsplit("/", 1)[0] or "/") for ns, p in files})
