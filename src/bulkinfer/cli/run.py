"""``bulkinfer run``: a job from flags, a TOML file and ``--set``, run or resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import load_config
from ..core.errors import BulkinferError, Interrupted
from .common import (
    FeatureColumnsOption,
    ModelOption,
    QuietOption,
    TextColumnOption,
    _fail,
    _prepare,
    _split,
    _stored_config,
)


def run(
    config: Annotated[Path | None, typer.Argument(help="Job file (TOML). Flags override it.")] = None,
    input: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="Input file, directory, glob or URI; repeatable.")
    ] = None,
    model: ModelOption = None,
    text_column: TextColumnOption = None,
    feature_columns: FeatureColumnsOption = None,
    id_column: Annotated[str | None, typer.Option(help="Row id column, copied to the output.")] = None,
    keep_columns: Annotated[
        list[str] | None, typer.Option(help="Input columns copied to the output; comma-separated.")
    ] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Output directory.")] = None,
    output_format: Annotated[
        str | None, typer.Option("--format", help="Output format: parquet, jsonl, csv or openai-batch.")
    ] = None,
    input_format: Annotated[
        str | None,
        typer.Option(help="Input format (default: from each file's extension; OpenAI batch files are detected)."),
    ] = None,
    input_encoding: Annotated[
        str | None,
        typer.Option(help="Text encoding of CSV/JSONL inputs (default: UTF-8 or a byte-order mark's; e.g. cp1252)."),
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Maximum rows per model call.")] = None,
    shard_rows: Annotated[int | None, typer.Option(help="Rows per shard (the unit of commit).")] = None,
    limit_rows: Annotated[int | None, typer.Option(help="Only the first N rows.")] = None,
    k: Annotated[int | None, typer.Option("--k", help="kNN models (--model items.index): neighbours per row.")] = None,
    prompt_template: Annotated[
        str | None, typer.Option(help='Generation models: each row\'s prompt, e.g. "Summarise: {text}".')
    ] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Generation models: tokens per row at most.")] = None,
    json_schema: Annotated[
        str | None, typer.Option(help="Generation models: a JSON schema file every completion must satisfy.")
    ] = None,
    expand_json: Annotated[
        bool, typer.Option("--expand-json", help="With --json-schema: the JSON's fields become typed columns.")
    ] = False,
    max_cost: Annotated[
        float | None, typer.Option(help="Stop cleanly (exit 1) once the run's projected cost passes this.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Any config field: --set runtime.batch_size=64.")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Discard a different job's output.")] = False,
    repair: Annotated[bool, typer.Option("--repair", help="Rebuild a corrupt ledger from the files.")] = False,
    retry_errors: Annotated[
        Path | None, typer.Option(help="Run again only the rows in OUTPUT/_errors/ (the job comes from OUTPUT).")
    ] = None,
    progress: Annotated[str | None, typer.Option(help="auto, bar, log or none.")] = None,
    backend: Annotated[str | None, typer.Option(help="local (this process), ray or spark.")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to join: auto, ray://host:10001 or host:6379 (default: start one).")
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Ray workers (default: as many as the cluster fits).")] = None,
    baseline: Annotated[
        str | None, typer.Option(help="An earlier output: compare this run's column statistics with it (drift).")
    ] = None,
    fail_on_drift: Annotated[
        bool, typer.Option("--fail-on-drift", help="Exit 1 after committing when a column drifted past max_psi.")
    ] = False,
    incremental_from: Annotated[
        str | None,
        typer.Option(help="An earlier output of this job: unchanged rows take their results from it."),
    ] = None,
    dedupe: Annotated[str | None, typer.Option(help="Infer identical inputs once: true, false or auto.")] = None,
    quiet: QuietOption = False,
) -> None:
    """Run (or resume) a job: every input row is written exactly once to the output."""
    _prepare(quiet)
    overrides: dict[str, Any] = {
        "source.paths": input or None,
        "model.name": model,
        "model.text_column": text_column,
        "model.feature_columns": _split(feature_columns),
        "source.id_column": id_column,
        "sink.keep_columns": _split(keep_columns),
        "sink.path": output,
        "sink.format": output_format,
        "runtime.batch_size": batch_size,
        "source.shard_rows": shard_rows,
        "execution.limit_rows": limit_rows,
        "model.options.k": k,
        "model.prompt_template": prompt_template,
        "model.max_new_tokens": max_new_tokens,
        "model.json_schema": json_schema,
        "model.expand_json": expand_json or None,
        "source.format": input_format,
        "source.encoding": input_encoding,
        "execution.max_cost": max_cost,
        "execution.overwrite": overwrite or None,
        "execution.repair": repair or None,
        "execution.progress": progress,
        "execution.backend": backend,
        "execution.ray_address": ray_address,
        "execution.workers": workers,
        "monitor.baseline": baseline,
        "monitor.fail_on_drift": fail_on_drift or None,
        "source.previous": incremental_from,
        "runtime.dedupe": dedupe,
    }
    from ..job import run_job

    try:
        base = None
        if retry_errors is not None:
            base, inputs = _stored_config(retry_errors)
            overrides["sink.path"] = str(retry_errors)
            overrides["source.paths"] = overrides["source.paths"] or inputs
        cfg = load_config(config, overrides, set_, base=base)
        result = run_job(cfg, retry_errors=retry_errors is not None)
    except Interrupted as exc:
        raise _fail(exc) from None
    except BulkinferError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        typer.echo("bulkinfer: interrupted; rerun the same command to resume", err=True)
        raise typer.Exit(Interrupted.exit_code) from None
    r = result.report
    typer.echo(
        f"done: {r['rows_out']} rows written this run ({r['rows_already_done']} already committed) in "
        f"{r['wall_s']:.1f} s, {r['rows_per_s']:.1f} rows/s -> {result.output}"
    )
    share = r["time_share"]
    typer.echo(
        "time: "
        + ", ".join(f"{k} {v:.0%}" for k, v in share.items())
        + f"; report: {result.output}/_bulkinfer/report.json"
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
