"""``bulkinfer run``: a job from flags, a TOML file and ``--set``, run or resumed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from ..config import load_config
from ..config.sink import SINK_FORMAT
from ..core.errors import BulkinferError, Interrupted
from .common import (
    FeatureColumnsOption,
    ModelOption,
    QuietOption,
    TextColumnOption,
    fail,
    prepare,
    split_list,
    stored_config,
)

# the flags of ``bulkinfer run`` (one per config field they set: FLAG_FIELDS)
ConfigFlag = Annotated[Path | None, typer.Argument(help="Job file (TOML). Flags override it.")]
InputFlag = Annotated[
    list[str] | None, typer.Option("--input", "-i", help="Input file, directory, glob or URI; repeatable.")
]
IdColumnFlag = Annotated[str | None, typer.Option(help="Row id column, copied to the output.")]
KeepColumnsFlag = Annotated[list[str] | None, typer.Option(help="Input columns copied to the output; comma-separated.")]
OutputFlag = Annotated[str | None, typer.Option("--output", "-o", help="Output directory.")]
OutputFormatFlag = Annotated[
    str | None, typer.Option("--format", help=f"Output format: {', '.join(get_args(SINK_FORMAT))}.")
]
InputFormatFlag = Annotated[
    str | None,
    typer.Option(help="Input format (default: from each file's extension; OpenAI batch files are detected)."),
]
InputEncodingFlag = Annotated[
    str | None,
    typer.Option(help="Text encoding of CSV/JSONL inputs (default: UTF-8 or a byte-order mark's; e.g. cp1252)."),
]
BatchSizeFlag = Annotated[int | None, typer.Option(help="Maximum rows per model call.")]
ShardRowsFlag = Annotated[int | None, typer.Option(help="Rows per shard (the unit of commit).")]
LimitRowsFlag = Annotated[int | None, typer.Option(help="Only the first N rows.")]
KFlag = Annotated[int | None, typer.Option("--k", help="kNN models (--model items.index): neighbours per row.")]
PromptTemplateFlag = Annotated[
    str | None, typer.Option(help='Generation models: each row\'s prompt, e.g. "Summarise: {text}".')
]
MaxNewTokensFlag = Annotated[int | None, typer.Option(help="Generation models: tokens per row at most.")]
JsonSchemaFlag = Annotated[
    str | None, typer.Option(help="Generation models: a JSON schema file every completion must satisfy.")
]
ExpandJsonFlag = Annotated[
    bool, typer.Option("--expand-json", help="With --json-schema: the JSON's fields become typed columns.")
]
MaxCostFlag = Annotated[
    float | None, typer.Option(help="Stop cleanly (exit 1) once the run's projected cost passes this.")
]
SetFlag = Annotated[list[str] | None, typer.Option("--set", help="Any config field: --set runtime.batch_size=64.")]
OverwriteFlag = Annotated[bool, typer.Option("--overwrite", help="Discard a different job's output.")]
RepairFlag = Annotated[bool, typer.Option("--repair", help="Rebuild a corrupt ledger from the files.")]
RetryErrorsFlag = Annotated[
    Path | None, typer.Option(help="Run again only the rows in OUTPUT/_errors/ (the job comes from OUTPUT).")
]
ProgressFlag = Annotated[str | None, typer.Option(help="auto, bar, log or none.")]
BackendFlag = Annotated[str | None, typer.Option(help="local (this process), ray or spark.")]
RayAddressFlag = Annotated[
    str | None, typer.Option(help="Ray cluster to join: auto, ray://host:10001 or host:6379 (default: start one).")
]
WorkersFlag = Annotated[int | None, typer.Option(help="Ray workers (default: as many as the cluster fits).")]
BaselineFlag = Annotated[
    str | None, typer.Option(help="An earlier output: compare this run's column statistics with it (drift).")
]
FailOnDriftFlag = Annotated[
    bool, typer.Option("--fail-on-drift", help="Exit 1 after committing when a column drifted past max_psi.")
]
IncrementalFromFlag = Annotated[
    str | None,
    typer.Option(help="An earlier output of this job: unchanged rows take their results from it."),
]
DedupeFlag = Annotated[str | None, typer.Option(help="Infer identical inputs once: true, false or auto.")]
MetricsPortFlag = Annotated[
    int | None, typer.Option(help="Serve the run's Prometheus metrics on this port while it runs (0: any free port).")
]

FLAG_FIELDS = {
    "input": "source.paths",
    "model": "model.name",
    "text_column": "model.text_column",
    "feature_columns": "model.feature_columns",
    "id_column": "source.id_column",
    "keep_columns": "sink.keep_columns",
    "output": "sink.path",
    "output_format": "sink.format",
    "batch_size": "runtime.batch_size",
    "shard_rows": "source.shard_rows",
    "limit_rows": "execution.limit_rows",
    "k": "model.options.k",
    "prompt_template": "model.prompt_template",
    "max_new_tokens": "model.max_new_tokens",
    "json_schema": "model.json_schema",
    "expand_json": "model.expand_json",
    "input_format": "source.format",
    "input_encoding": "source.encoding",
    "max_cost": "execution.max_cost",
    "overwrite": "execution.overwrite",
    "repair": "execution.repair",
    "progress": "execution.progress",
    "backend": "execution.backend",
    "ray_address": "execution.ray_address",
    "workers": "execution.workers",
    "baseline": "monitor.baseline",
    "fail_on_drift": "monitor.fail_on_drift",
    "incremental_from": "source.previous",
    "dedupe": "runtime.dedupe",
    "metrics_port": "metrics.port",
}
_COMMA_SEPARATED = {"feature_columns", "keep_columns"}


def overrides(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields ``flags`` (the command's parameters by name) set; None for a flag not
    given, a switch left off or an empty list, so that the TOML file's value stands."""
    out: dict[str, Any] = {}
    for name, field in FLAG_FIELDS.items():
        value = flags[name]
        if name in _COMMA_SEPARATED:
            value = split_list(value)
        elif value is False or value == []:
            value = None
        out[field] = value
    return out


def run(
    config: ConfigFlag = None,
    input: InputFlag = None,
    model: ModelOption = None,
    text_column: TextColumnOption = None,
    feature_columns: FeatureColumnsOption = None,
    id_column: IdColumnFlag = None,
    keep_columns: KeepColumnsFlag = None,
    output: OutputFlag = None,
    output_format: OutputFormatFlag = None,
    input_format: InputFormatFlag = None,
    input_encoding: InputEncodingFlag = None,
    batch_size: BatchSizeFlag = None,
    shard_rows: ShardRowsFlag = None,
    limit_rows: LimitRowsFlag = None,
    k: KFlag = None,
    prompt_template: PromptTemplateFlag = None,
    max_new_tokens: MaxNewTokensFlag = None,
    json_schema: JsonSchemaFlag = None,
    expand_json: ExpandJsonFlag = False,
    max_cost: MaxCostFlag = None,
    set_: SetFlag = None,
    overwrite: OverwriteFlag = False,
    repair: RepairFlag = False,
    retry_errors: RetryErrorsFlag = None,
    progress: ProgressFlag = None,
    backend: BackendFlag = None,
    ray_address: RayAddressFlag = None,
    workers: WorkersFlag = None,
    baseline: BaselineFlag = None,
    fail_on_drift: FailOnDriftFlag = False,
    incremental_from: IncrementalFromFlag = None,
    dedupe: DedupeFlag = None,
    metrics_port: MetricsPortFlag = None,
    quiet: QuietOption = False,
) -> None:
    """Run (or resume) a job: every input row is written exactly once to the output."""
    prepare(quiet)
    fields = overrides(locals())
    from ..job import run_job

    try:
        base = None
        if retry_errors is not None:
            base, inputs = stored_config(retry_errors)
            fields["sink.path"] = str(retry_errors)
            fields["source.paths"] = fields["source.paths"] or inputs
        cfg = load_config(config, fields, set_, base=base)
        result = run_job(cfg, retry_errors=retry_errors is not None)
    except BulkinferError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        typer.echo("bulkinfer: stopped: interrupted; rerun the same command to resume", err=True)
        raise typer.Exit(Interrupted.exit_code) from None
    _summary(result.report, str(result.output))


def _rates(r: Mapping[str, Any]) -> str:
    """The run's throughput as what it counts: rows the model ran per second, and rows written per
    second where rows were written without running it (the gate's sample, duplicates, an earlier output)."""
    inferred = f"{r['rows_per_s']:.1f} rows/s inferred"
    written = r.get("rows_written_per_s", r["rows_per_s"])
    reuse = r.get("reuse") or {}
    reused = sum(reuse.get(k, 0) for k in ("rows_from_gate", "rows_deduplicated", "rows_from_previous"))
    return inferred + (f" ({written:.1f} rows/s written, {reused} rows reused)" if reused else "")


def _summary(r: Mapping[str, Any], output: str) -> None:
    """The lines a finished run prints: rows, time shares, index, backend, cost."""
    latest = r.get("latest_run") or {}
    if latest.get("did_nothing"):  # the report kept the last run that did work: say what this one did
        typer.echo(
            f"done: 0 rows written this run ({latest['rows_already_done']} already committed) in "
            f"{latest['wall_s']:.1f} s: nothing left to do -> {output}"
        )
        typer.echo(f"last run that did work: {r['rows_out']} rows at {r['rows_per_s']:.1f} rows/s, {r['started_at']}; "
                   f"report: {output}/_bulkinfer/report.json")  # fmt: skip
        return
    typer.echo(
        f"done: {r['rows_out']} rows written this run ({r['rows_already_done']} already committed) in "
        f"{r['wall_s']:.1f} s, {_rates(r)} -> {output}"
    )
    share = r["time_share"]
    typer.echo(
        "time: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()) + f"; report: {output}/_bulkinfer/report.json"
    )
    if "index" in r:
        ix = r["index"]
        typer.echo(
            f"index: {ix['index']} ({ix['kind']}, {ix['vectors']} vectors), recall@{ix['k']} {ix['recall']:.4f}, "
            f"built in {ix['build_s']:.1f} s"
        )
    if "backend" in r:
        b = r["backend"]
        if b["name"] == "spark":
            typer.echo(
                f"spark: {b['master']}, {b['slots']} task slot(s), {b['shards']} shard(s) in {b['tasks']} task(s), "
                f"{b['task_retries']} task retr{'y' if b['task_retries'] == 1 else 'ies'}, {b['cancelled']} cancelled"
            )
        else:
            typer.echo(
                f"ray: {b['workers']} worker(s), {b['calls']} call(s), {b['splits']} straggler split(s), "
                f"{b['requeued']} shard(s) re-queued, {b['discarded']} duplicate attempt(s) discarded, "
                f"{b['workers_lost']} worker(s) lost"
            )
    if r["cost"]["per_million_rows"] is not None and r["cost"]["instance_price_per_hour"]:
        typer.echo(f"cost: {r['cost']['per_million_rows']:.4f} {r['cost']['currency']} per million rows")
