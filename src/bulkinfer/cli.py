"""The ``bulkinfer`` command: parse, build the config, call the library, map errors to exit codes.

Exit codes: 0 done; 1 failed; 2 usage error; 75 interrupted but resumable.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from .config import field_docs, load_config
from .core.errors import BulkinferError, Interrupted
from .core.hardware import quiet_tokenizers

__all__ = ["app", "main"]


def _fields_epilog() -> str:
    lines = ["Config fields (TOML sections, or --set section.field=value):", ""]
    for name, default, doc in field_docs():
        lines.append(f"  {name} = {default}  —  {doc}")
    return "\n\n".join(lines)


app = typer.Typer(
    name="bulkinfer",
    help="Offline batch inference: big batches, exactly-once output, resume after any crash.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

_CSV = {"help": "Comma-separated list."}


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _prepare(quiet: bool) -> None:
    """Offline model hub, quiet tokenizers, and log lines on stderr."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_tokenizers()
    _setup_logging(quiet)


class _LineFormat(logging.Formatter):
    """``bulkinfer: <message>``; a library's own warning names the library (``bulkinfer: [ray] ...``)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name == "bulkinfer" or record.name.startswith("bulkinfer."):
            return f"bulkinfer: {record.getMessage()}"
        source = record.name.split(".")[0]
        if source == "root":  # a library that logs on the root logger: named by where its file is installed
            found = re.search(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)", record.pathname)
            source = found.group(1).removesuffix(".py") if found else "python"
        return f"bulkinfer: [{source}] {record.getMessage()}"


def _setup_logging(quiet: bool) -> None:
    """bulkinfer's lines at INFO (WARNING with -q) on stderr; the libraries it drives only from
    WARNING up, so a quantizer's or an exporter's progress chatter stays out of the job's log."""
    if not logging.root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_LineFormat())
        logging.root.addHandler(handler)
        logging.root.setLevel(logging.WARNING)
    logging.getLogger("bulkinfer").setLevel(logging.WARNING if quiet else logging.INFO)


def _stored_config(out: Path) -> tuple[dict[str, Any], list[str]]:
    """The config a finished run stored, and its input files as absolute URIs."""
    from .commit.ledger import Ledger
    from .core.errors import OutputError

    plan = Ledger(out).read_plan()
    if plan is None:
        raise OutputError(f"{out}: not a bulkinfer output directory (no _bulkinfer/job.json)")
    return plan.config, [f.uri for f in plan.inputs]


def _fail(exc: BulkinferError) -> typer.Exit:
    typer.echo(f"bulkinfer: error: {exc}", err=True)
    return typer.Exit(exc.exit_code)


# Options that `run` and `serve` share.
ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help="minilm, a model directory, a .joblib file, or module:attr.")
]
TextColumnOption = Annotated[str | None, typer.Option(help="Column holding the text (text models).")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors.")]
FeatureColumnsOption = Annotated[
    list[str] | None, typer.Option(help="Feature columns (tabular models); comma-separated.")
]


@app.command(epilog=_fields_epilog())
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
    backend: Annotated[str | None, typer.Option(help="local (this process) or ray.")] = None,
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
    from .job import run_job

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
        typer.echo(
            f"ray: {b['workers']} worker(s), {b['splits']} straggler split(s), {b['requeued']} shard(s) re-queued, "
            f"{b['discarded']} duplicate attempt(s) discarded, {b['workers_lost']} worker(s) lost"
        )
    if r["cost"]["per_million_rows"] is not None and r["cost"]["instance_price_per_hour"]:
        typer.echo(f"cost: {r['cost']['per_million_rows']:.4f} {r['cost']['currency']} per million rows")


def _kept(groups: list[str]) -> str:
    """What an int8 candidate keeps in fp32, in a few words: "outlier channels + 2 blocks"."""
    from .engines.int8 import OUTLIERS

    blocks = [g for g in groups if g != OUTLIERS]
    words = ["outlier channels"] if OUTLIERS in groups else []
    if blocks:
        words.append(f"{len(blocks)} block{'s' if len(blocks) > 1 else ''}")
    return " + ".join(words)


@app.command()
def tune(
    config: Annotated[Path | None, typer.Argument(help="Job file (TOML). Flags override it.")] = None,
    input: Annotated[list[str] | None, typer.Option("--input", "-i", help="Input file, directory or glob.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="minilm or a model directory.")] = None,
    text_column: Annotated[str | None, typer.Option(help="Column holding the text.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Any config field, e.g. runtime.quality_floor=0.995.")
    ] = None,
    sample_rows: Annotated[int, typer.Option(help="Rows of the input to measure on.")] = 512,
    batch_sizes: Annotated[
        str | None, typer.Option(help="Batch sizes to try, comma-separated (default 8,16,32,64; 64..1024 on a GPU).")
    ] = None,
    candidates: Annotated[
        str | None,
        typer.Option(
            help="Engine/precision pairs to try (default all; torch's on a GPU): onnxruntime/int8,torch/fp16."
        ),
    ] = None,
    int8_search: Annotated[
        bool,
        typer.Option(help="When int8 fails the gate, search the fewest blocks to keep in fp32 (several builds)."),
    ] = True,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write the tuned job file.")] = None,
    print_only: Annotated[bool, typer.Option("--print", help="Print the tuned job instead of writing it.")] = False,
) -> None:
    """Measure engine x precision x batch size on a sample of the input; keep the fastest that passes the gate."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_tokenizers()
    _setup_logging(quiet=True)
    from rich.console import Console
    from rich.table import Table

    from .precision.tune import to_toml
    from .precision.tune import tune as run_tune

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 110)
    overrides = {"source.paths": input or None, "model.name": model, "model.text_column": text_column}
    try:
        cfg = load_config(config, overrides, set_)
        sizes = tuple(int(x) for x in (batch_sizes or "").split(",") if x.strip())
        pairs = tuple(tuple(c.strip().split("/", 1)) for c in (candidates or "").split(",") if c.strip())
        result = run_tune(
            cfg,
            sample_rows,
            sizes or None,
            precisions=pairs or None,  # type: ignore[arg-type]
            int8_search=int8_search,
            on_candidate=lambda c: console.print(
                f"  {c.engine:12s} {c.precision:5s} batch {c.batch_size:3d} threads {c.threads} x{c.processes}: "
                + (f"{c.rows_per_s} rows/s" if c.rows_per_s else c.note or "skipped")
            ),
        )
    except BulkinferError as exc:
        raise _fail(exc) from None
    except ValueError:
        raise typer.BadParameter("--batch-sizes: expected numbers like 8,16,32") from None
    from .core.hardware import isa_key

    table = Table(title=f"bulkinfer tune: {result.sample_rows} rows of the job's input on {isa_key()}")
    columns = ["engine", "precision", "batch", "threads", "processes", "rows/s", "mean cosine", "top-10 overlap",
               "gate", ""]  # fmt: skip
    for col in columns:
        table.add_column(col)
    for c in result.candidates:
        q = c.quality or {}
        table.add_row(
            c.engine,
            c.precision + (f" ({_kept(c.int8_fp32_groups)} fp32)" if c.int8_fp32_groups else ""),
            str(c.batch_size),
            str(c.threads),
            str(c.processes) + (f" ({c.cpu_per_wall} CPU s/s)" if c.cpu_per_wall is not None else ""),
            str(c.rows_per_s or "-"),
            str(q.get("mean_cosine", "1 (fp32)" if c.precision == "fp32" else "-")),
            str(q.get("top10_overlap", "-")),
            "pass" if c.passed else ("FAIL" if c.quality else "-"),
            "<- chosen" if c is result.best else ("" if c.passed else c.note),
        )
    console.print(table)
    assert result.best is not None and result.config is not None
    best = result.best
    header = (
        f"tuned by bulkinfer tune: {best.engine} {best.precision}, batch {best.batch_size}, "
        f"{best.threads} threads, {best.rows_per_s} rows/s on {result.sample_rows} sample rows"
        + (f", {best.processes} processes: execution.backend = ray, num_cpus = 1" if best.processes > 1 else "")
    )
    text = to_toml(result.config, header)
    if print_only:
        typer.echo(text)
        return
    target = output or (config.with_suffix(".tuned.toml") if config else Path("tuned.toml"))
    target.write_text(text, encoding="utf-8")
    typer.echo(f"chosen: {header.removeprefix('tuned by bulkinfer tune: ')}; wrote {target}")


@app.command()
def machine(
    device: Annotated[str, typer.Option(help="The GPU device to ask torch about.")] = "cuda",
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Also list what bulkinfer tune measured for it here.")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config fields, e.g. runtime.cache_dir=...")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """What runs fast on this machine: its CPU's fast-path features, the GPU, the inference libraries, and for
    each engine and precision whether it runs natively, on weak kernels, emulated, or not at all here."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _setup_logging(quiet=True)
    from .core.hardware import survey

    found = survey(device)
    if model:
        try:
            devices = ["cpu", device] if found["gpu"] else ["cpu"]
            from .adapters import resolve_model
            from .precision.tune import best_measured

            cfg = load_config(None, {"model.name": model}, set_)
            found["tune"] = best_measured(cfg, resolve_model(cfg).digest, devices)
        except BulkinferError as exc:
            raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(found, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    c, card, libs = found["cpu"], found["gpu"], found["libraries"]
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(f"cpu: {c['model']} x{c['cpus']}; machine kind {found['isa']}")
    if c.get("unconfirmed"):
        console.print(f"  /proc/cpuinfo also lists {' '.join(c['unconfirmed'])}: not available to this process")
    gpu_line = f"{card['name']}, compute capability {card['capability']}, {card['memory_gib']} GiB" if card else "none"
    console.print(f"gpu ({device}): {gpu_line}")
    installed = ", ".join(f"{k} {v}" for k, v in libs.items() if k != "onnxruntime_providers")
    console.print(
        f"libraries: {installed}; onnxruntime providers: {', '.join(libs['onnxruntime_providers']) or 'none'}"
    )
    table = Table(title="engines and precisions here")
    for col in ("device", "engine", "precision", "here", ""):
        table.add_column(col)
    for r in found["precisions"]:
        table.add_row(r["device"], r["engine"], r["precision"], r["verdict"], r["note"])
    console.print(table)
    for where, best in (found.get("tune") or {}).items():
        console.print(f"bulkinfer tune here ({where}): {best}")


@app.command()
def serve(
    config: Annotated[Path | None, typer.Argument(help="Job file (TOML): its model, engine and precision.")] = None,
    model: ModelOption = None,
    text_column: TextColumnOption = None,
    feature_columns: FeatureColumnsOption = None,
    id_column: Annotated[str | None, typer.Option(help="Row id column, echoed in answers when sent.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 8000; 0: any free port).")] = None,
    k: Annotated[int | None, typer.Option("--k", help="kNN models: the most neighbours a search returns.")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Any config field: --set serve.max_batch_size=32.")
    ] = None,
    quiet: QuietOption = False,
) -> None:
    """Answer online requests with the job's model: POST /v1/predict, /v1/embeddings (OpenAI-compatible)."""
    _prepare(quiet)
    overrides: dict[str, Any] = {
        "model.name": model,
        "model.text_column": text_column,
        "model.feature_columns": _split(feature_columns),
        "source.id_column": id_column,
        "serve.host": host,
        "serve.port": port,
        "model.options.k": k,
    }
    from .serve import serve as run_server

    try:
        run_server(load_config(config, overrides, set_))
    except BulkinferError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
def inspect(
    output: Annotated[
        str, typer.Argument(help="An output of bulkinfer run: a folder, or an object-store prefix (s3://...).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show what is committed, what remains, errors and the job fingerprint; for one part file,
    its provenance (job, model, input file and rows) and whether _SUCCESS vouches for it."""
    from .outputs.status import inspect_output, inspect_part, is_part_file

    try:
        info = inspect_part(output) if is_part_file(output) else inspect_output(output)
    except BulkinferError as exc:
        raise _fail(exc) from None
    if "provenance" in info:
        _print_part(info, as_json)
        return
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    state = "complete" if info["complete"] else ("running" if info["running"] else "incomplete")
    typer.echo(f"{info['output']}: {state}")
    typer.echo(f"  job fingerprint  {info['job_fingerprint']}")
    typer.echo(f"  model            {info['model']['kind']} {info['model']['location']}")
    typer.echo(
        f"  shards           {info['shards_committed']}/{info['shards_planned']} committed, "
        f"{info['shards_remaining']} remaining"
    )
    typer.echo(
        f"  rows             {info['rows_committed']}/{info['rows_planned']} committed, "
        f"{info['rows_remaining']} remaining"
    )
    typer.echo(f"  errors           {info['error_records']} error record(s)")
    if info["column_types"]:
        typer.echo(f"  column types     {', '.join(f'{c} {t}' for c, t in info['column_types'].items())}")
    if info["lock_holder"]:
        typer.echo(f"  running          {info['lock_holder']}")
    if info["last_run"]:
        lr = info["last_run"]
        typer.echo(f"  last run         {lr['status']}, {lr['rows_out']} rows, {lr['rows_per_s']} rows/s")


def _print_part(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    typer.echo(f"{info['file']}: {info['rows']} rows, {info['bytes']} bytes; columns {', '.join(info['columns'])}")
    p = info["provenance"]
    if p is None:
        typer.echo("  no provenance in its metadata: not a part written by bulkinfer")
    else:
        typer.echo(f"  job fingerprint  {p['job_fingerprint']} (bulkinfer {p['bulkinfer_version']})")
        typer.echo(f"  model            {p['model_kind']} {p['model']} (digest {p['model_digest']}, {p['precision']})")
        lo, hi = p["input_rows"]
        typer.echo(f"  input            {p['input']} rows {lo}-{hi} (shard {p['shard']})")
    vouched = {True: "listed in _SUCCESS, checksum matches", False: "listed in _SUCCESS with ANOTHER checksum"}
    typer.echo(f"  committed        {vouched.get(info['in_manifest'], 'no _SUCCESS beside it lists this file')}")


@app.command()
def index(
    output: Annotated[
        str, typer.Argument(help="A finished bulkinfer output (Parquet) with a vector column: a folder or s3://...")
    ],
    dest: Annotated[Path, typer.Option("--output", "-o", help="The index file to write (e.g. items.index).")],
    column: Annotated[str, typer.Option(help="The vector column.")] = "embedding",
    kind: Annotated[str, typer.Option(help="flat (exact), hnsw, or ivf-pq (compressed).")] = "hnsw",
    metric: Annotated[str, typer.Option(help="cosine, ip (inner product) or l2.")] = "cosine",
    k: Annotated[int, typer.Option(help="The k of the recall@k check.")] = 10,
    min_recall: Annotated[
        float | None, typer.Option(help="Refuse (exit 1, nothing written) an index whose recall@k is lower.")
    ] = None,
    ef_search: Annotated[int | None, typer.Option(help="HNSW: candidates kept while searching.")] = None,
    nprobe: Annotated[int | None, typer.Option(help="IVF-PQ: lists searched per query.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    quiet: QuietOption = False,
) -> None:
    """Build an approximate-nearest-neighbour index (Faiss) over an output's vectors; check its recall."""
    _prepare(quiet)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from .outputs.index import IndexSpec, build_index

    if kind not in ("flat", "hnsw", "ivf-pq") or metric not in ("cosine", "ip", "l2"):
        typer.echo("bulkinfer: error: --kind is flat, hnsw or ivf-pq; --metric is cosine, ip or l2", err=True)
        raise typer.Exit(2)
    spec = IndexSpec(column=column, kind=kind, metric=metric, k=k, ef_search=ef_search, nprobe=nprobe)  # type: ignore[arg-type]
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=quiet or as_json,
        transient=True,
    ) as bar:
        task = bar.add_task("indexing", total=None)
        try:
            report = build_index(
                output, dest, spec, min_recall, lambda done, total: bar.update(task, completed=done, total=total)
            )
        except BulkinferError as exc:
            raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(asdict(report), indent=1))
        return
    typer.echo(
        f"wrote {report.index}: {report.kind} ({report.metric}, {report.dim} dims, {report.params}), "
        f"{report.vectors} vectors, {report.index_bytes / 2**20:.1f} MiB, built in {report.build_s:.1f} s"
    )
    typer.echo(
        f"recall@{report.k} {report.recall:.4f} against exact search on {report.queries} sampled queries; "
        f"{report.queries_per_s:.0f} queries/s"
        + (f"; {report.rows_failed} row(s) not indexed: see {report.index}.errors.jsonl" if report.rows_failed else "")
    )


@app.command()
def compare(
    old: Annotated[str, typer.Argument(help="The output in production (a finished folder or s3://...).")],
    new: Annotated[str, typer.Argument(help="The candidate output, over the same ids.")],
    id_column: Annotated[str | None, typer.Option("--id", help="Join column (default: the runs' id column).")] = None,
    column: Annotated[list[str] | None, typer.Option(help="Only these output columns; comma-separated.")] = None,
    sample: Annotated[int | None, typer.Option(help="About N ids, drawn by hash across the whole output.")] = None,
    k: Annotated[int, typer.Option("--k", help="Neighbours per query for the top-K overlap.")] = 10,
    queries: Annotated[int, typer.Option(help="Queries for the top-K overlap.")] = 200,
    fail_if: Annotated[
        str | None,
        typer.Option(help='Exit 1 when this holds, e.g. "cosine.p5 < 0.95 or topk_overlap < 0.8" (see --json).'),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
    quiet: QuietOption = False,
) -> None:
    """Compare two outputs row by row (cosine, top-K overlap, label agreement, KS, PSI); gate a rollout."""
    _prepare(quiet)
    from .core.errors import CheckFailed
    from .outputs.compare import CompareSpec, compare_outputs, gate, summary_lines

    spec = CompareSpec(id_column, tuple(_split(column) or ()), sample, k, queries)
    try:
        result = compare_outputs(old, new, spec)
        failed, read = gate(fail_if, result["figures"]) if fail_if else (False, {})
    except BulkinferError as exc:
        raise _fail(exc) from None
    if fail_if:
        result["gate"] = {"fail_if": fail_if, "failed": failed, "figures": read}
    typer.echo(json.dumps(result, indent=1) if as_json else "\n".join(summary_lines(result)))
    if failed:
        shown = ", ".join(f"{n} = {'not measured' if v is None else round(v, 6)}" for n, v in read.items())
        raise _fail(CheckFailed(f"compare: {fail_if!r} holds ({shown}); keep {old} in production"))
    if fail_if and not as_json:
        typer.echo(f"gate passed: {fail_if!r} does not hold")


@app.command()
def report(
    output: Annotated[str, typer.Argument(help="An output of bulkinfer run (a folder or s3://...).")],
    compare_with: Annotated[
        str | None, typer.Option("--compare", help="Another output (production) to compare this one with.")
    ] = None,
    dest: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="The HTML file (default: OUTPUT/_bulkinfer/report.html; ./report.html for s3://)."
        ),
    ] = None,
    sample: Annotated[int | None, typer.Option(help="--compare: about N ids, drawn across the whole output.")] = None,
    quiet: QuietOption = False,
) -> None:
    """One self-contained HTML page about a run: throughput, time, batches, cost, errors, statistics,
    drift and, with --compare, the canary comparison. It opens offline."""
    _prepare(quiet)
    from .outputs.compare import CompareSpec, compare_outputs
    from .report.html import load_run, render_report
    from .sinks import is_remote

    try:
        run = load_run(output)
        comparison = compare_outputs(compare_with, output, CompareSpec(sample=sample)) if compare_with else None
    except BulkinferError as exc:
        raise _fail(exc) from None
    if dest is None:
        dest = Path("report.html") if is_remote(output) else Path(output) / "_bulkinfer" / "report.html"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(render_report(run, comparison), encoding="utf-8")
    typer.echo(f"wrote {dest}")


@app.command()
def costs(
    outputs: Annotated[list[str], typer.Argument(help="Outputs (folders, s3://... prefixes or globs of them).")],
    by: Annotated[
        list[str] | None, typer.Option(help="Label keys to group by (default: every cost.labels key); comma-separated.")
    ] = None,
    output_format: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
) -> None:
    """Sum the cost of every run of the outputs by month and cost.labels (the bill per team and model)."""
    from .outputs.costs import collect_runs, render, sum_costs

    if output_format not in ("table", "csv", "json"):
        typer.echo("bulkinfer: error: --format is table, csv or json", err=True)
        raise typer.Exit(2)
    try:
        rows = sum_costs(collect_runs(outputs), _split(by))
    except BulkinferError as exc:
        raise _fail(exc) from None
    typer.echo(render(rows, output_format))


def main() -> None:
    """Console entry point."""
    app()
