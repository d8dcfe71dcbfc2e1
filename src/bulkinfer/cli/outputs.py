"""The commands over finished outputs: ``inspect``, ``index``, ``compare``, ``report``, ``costs``
and ``review``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.errors import BulkinferError, CheckFailed, ConfigError
from .common import (
    QuietOption,
    fail,
    prepare,
    split_list,
)


def inspect(
    output: Annotated[
        str, typer.Argument(help="An output of bulkinfer run: a folder, or an object-store prefix (s3://...).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show what is committed, what remains, errors and the job fingerprint; for one part file,
    its provenance (job, model, input file and rows) and whether _SUCCESS vouches for it."""
    from ..outputs.status import inspect_output, inspect_part, is_part_file

    try:
        info = inspect_part(output) if is_part_file(output) else inspect_output(output)
    except BulkinferError as exc:
        raise fail(exc) from None
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
    prepare(quiet)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from ..outputs.index import IndexSpec, build_index, describe_params

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
            raise fail(exc) from None
    if as_json:
        typer.echo(json.dumps(asdict(report), indent=1))
        return
    typer.echo(
        f"wrote {report.index}: {report.kind} ({report.metric}, {report.dim} dims, "
        f"{describe_params(report.params)}), "
        f"{report.vectors} vectors, {report.index_bytes / 2**20:.1f} MiB, built in {report.build_s:.1f} s"
    )
    typer.echo(
        f"recall@{report.k} {report.recall:.4f} against exact search on {report.queries} sampled queries; "
        f"{report.queries_per_s:.0f} queries/s"
        + (f"; {report.rows_failed} row(s) not indexed: see {report.index}.errors.jsonl" if report.rows_failed else "")
    )


def compare(
    old: Annotated[str, typer.Argument(help="The output in production (a finished folder or s3://...).")],
    new: Annotated[str | None, typer.Argument(help="The candidate output, over the same ids.")] = None,
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
    reviews: Annotated[
        str | None,
        typer.Option(help="Instead of NEW: the route whose review decisions judge OLD's rule (precision, recall)."),
    ] = None,
    quiet: QuietOption = False,
) -> None:
    """Compare two outputs row by row (cosine, top-K overlap, label agreement, KS, PSI), or an
    output's routing rule with its reviewers' decisions (--reviews); gate a rollout."""
    prepare(quiet)
    from ..outputs.compare import CompareSpec, compare_outputs, summary_lines

    spec = CompareSpec(id_column, tuple(split_list(column) or ()), sample, k, queries)
    try:
        if (new is None) == (reviews is None):
            raise ConfigError("compare: give a candidate output NEW, or --reviews ROUTE, not both")
        if reviews is not None:
            _compare_reviews(old, reviews, fail_if, as_json)
            return
        assert new is not None
        result = compare_outputs(old, new, spec)
        failed, read = _gated(result, result["figures"], fail_if)
    except BulkinferError as exc:
        raise fail(exc) from None
    typer.echo(json.dumps(result, indent=1) if as_json else "\n".join(summary_lines(result)))
    _gate_verdict(fail_if, failed, read, f"keep {old} in production", as_json)


def _compare_reviews(out: str, route: str, fail_if: str | None, as_json: bool) -> None:
    """``compare OUT --reviews ROUTE``: the rule against its reviewers, gated by ``fail_if``."""
    from ..outputs.review_rows import gate_figures, reviewed

    result = reviewed(out, route)
    result["figures"] = gate_figures(result)
    failed, read = _gated(result, result["figures"], fail_if)
    _print_review(result, as_json)
    _gate_verdict(fail_if, failed, read, "the rule needs work before it runs unreviewed", as_json)


def _gated(result: dict[str, Any], figures: dict[str, Any], fail_if: str | None) -> tuple[bool, dict[str, Any]]:
    """Whether ``fail_if`` holds for ``figures`` and the figures it read, noted in ``result``'s ``gate``."""
    from ..outputs.compare import gate

    if not fail_if:
        return False, {}
    failed, read = gate(fail_if, figures)
    result["gate"] = {"fail_if": fail_if, "failed": failed, "figures": read}
    return failed, read


def _gate_verdict(fail_if: str | None, failed: bool, read: dict[str, Any], advice: str, as_json: bool) -> None:
    """Exit 1 (CheckFailed) when the gate's condition held, naming the figures it read."""
    if failed:
        shown = ", ".join(f"{n} = {'not measured' if v is None else round(v, 6)}" for n, v in read.items())
        raise fail(CheckFailed(f"compare: {fail_if!r} holds ({shown}); {advice}"))
    if fail_if and not as_json:
        typer.echo(f"gate passed: {fail_if!r} does not hold")


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
    prepare(quiet)
    from ..outputs.compare import CompareSpec, compare_outputs
    from ..outputs.html import load_run, render_report
    from ..sinks import is_remote

    try:
        run = load_run(output)
        comparison = compare_outputs(compare_with, output, CompareSpec(sample=sample)) if compare_with else None
    except BulkinferError as exc:
        raise fail(exc) from None
    if dest is None:
        dest = Path("report.html") if is_remote(output) else Path(output) / "_bulkinfer" / "report.html"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(render_report(run, comparison), encoding="utf-8")
    typer.echo(f"wrote {dest}")


def costs(
    outputs: Annotated[list[str], typer.Argument(help="Outputs (folders, s3://... prefixes or globs of them).")],
    by: Annotated[
        list[str] | None, typer.Option(help="Label keys to group by (default: every cost.labels key); comma-separated.")
    ] = None,
    output_format: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
) -> None:
    """Sum the cost of every run of the outputs by month and cost.labels (the bill per team and model)."""
    from ..outputs.costs import collect_runs, render, sum_costs

    if output_format not in ("table", "csv", "json"):
        typer.echo("bulkinfer: error: --format is table, csv or json", err=True)
        raise typer.Exit(2)
    try:
        rows = sum_costs(collect_runs(outputs), split_list(by))
    except BulkinferError as exc:
        raise fail(exc) from None
    typer.echo(render(rows, output_format))


def review(
    output: Annotated[str, typer.Argument(help="A finished job's output whose route sent rows to review.")],
    route: Annotated[str, typer.Option(help="The route whose folder holds the rows to review.")] = "review",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free port).")] = 8001,
    api_keys_file: Annotated[
        str | None, typer.Option(help="serve's API keys file: who may review (a key's id is the reviewer).")
    ] = None,
    lease_s: Annotated[float, typer.Option(help="Seconds a reviewer holds a row before another may take it.")] = 300,
    decisions_dsn: Annotated[
        str | None,
        typer.Option(help="postgresql://... or redis://...: each decision also goes to a table or hash there, once."),
    ] = None,
    decisions_table: Annotated[
        str, typer.Option(help="With --decisions-dsn: the PostgreSQL table, or the Redis hash's name before the queue.")
    ] = "review_decisions",
    audit: Annotated[
        int, typer.Option(help="Also review this many rows the job published (a fixed sample): the rule's recall.")
    ] = 0,
    summary: Annotated[
        bool, typer.Option("--summary", help="Print each rule's rows, approvals, rejections and precision; exit.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --summary: as JSON.")] = False,
    quiet: QuietOption = False,
) -> None:
    """Open the rows a job routed to review in a web page: each with its picture or text, every
    model's scores and the rule that sent it; approve (a) or reject (r), with a note. Each
    decision is written once (<queue>/_review/decisions.parquet), a row held by one reviewer at a time."""
    prepare(quiet)
    from ..outputs.review_rows import reviewed
    from ..serve import serve_review

    try:
        if audit < 0:
            raise ConfigError(f"--audit {audit}: a number of published rows, 0 or more")
        if summary:
            _print_review(reviewed(output, route), as_json)
            return
        mirror = (decisions_dsn, decisions_table) if decisions_dsn else None
        serve_review(output, route, host, port, api_keys_file, lease_s, mirror, audit)
    except BulkinferError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def _print_review(figures: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(figures, indent=1))
        return
    typer.echo(f"{figures['rows']} rows under review, {figures['decided']} decided")
    for rule, f in figures["rules"].items():
        precision = "-" if f["precision"] is None else f"{f['precision']:.2f}"
        counts = f"{f['rejected']} rejected  {f['approved']} approved  {f['pending']} pending"
        typer.echo(f"  {f['rows']:>6} rows  {counts}  precision {precision}  {rule}")
    a = figures["audit"]
    typer.echo(f"  audit: {a['rejected']} rejected  {a['approved']} approved of {figures['published']} published rows")
    shown = {k: "-" if figures[k] is None else f"{figures[k]:.2f}" for k in ("precision", "miss_rate", "recall")}
    typer.echo(f"rule: precision {shown['precision']}  recall {shown['recall']}  miss rate {shown['miss_rate']}"
               + ("" if figures["recall"] is not None else "  (recall: review --audit N published rows)"))  # fmt: skip


def skew(
    output: Annotated[str, typer.Argument(help="A finished output of a Feast-sourced job (source.kind = feast).")],
    sample: Annotated[int, typer.Option(help="Entities checked: those whose ids hash lowest.", min=1)] = 100,
    max_share: Annotated[
        float, typer.Option(help="Exit 1 when more than this share of entities differ on a feature or output.")
    ] = 0.0,
    tolerance: Annotated[float, typer.Option(help="Differences up to this are equal.", min=0)] = 1e-9,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    quiet: QuietOption = False,
) -> None:
    """Online/offline skew: features read online now and offline as of now, and the model's answers on each."""
    prepare(quiet)
    from ..serve.skew import measure_skew

    try:
        found = measure_skew(output, sample, tolerance)
    except BulkinferError as exc:
        raise fail(exc) from None
    if as_json:
        typer.echo(json.dumps({**asdict(found), "worst_share": found.worst_share()}, indent=1))
    else:
        typer.echo(f"{found.entities} entities, online now against offline as of now:")
        for kind, figures in (("feature", found.features), ("output", found.outputs)):
            for name, f in figures.items():
                gap = f["max_abs_difference"]
                typer.echo(f"  {kind} {name:<24} {f['differ']:>6} differ   max |difference| {gap:.6g}")
    if found.worst_share() > max_share:
        raise typer.Exit(1)
