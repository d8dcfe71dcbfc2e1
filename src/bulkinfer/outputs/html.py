"""``bulkinfer report OUT/ [--compare OTHER/]``: one self-contained HTML page about a run.

Everything comes from what the run left behind (``report.json``, ``stats.json``,
``job.json``, ``_SUCCESS``, ``_errors/``) and, with ``--compare``, from
:func:`bulkinfer.outputs.compare.compare_outputs`. Charts are drawn by matplotlib as inline SVG:
no script, no stylesheet or font to fetch, so the file opens offline and prints. Every
chart carries its figures as labels (no legend hunt) and a table beside it has the exact
numbers.
"""

from __future__ import annotations

import html
import itertools
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import OutputError
from ..core.layout import ERRORS, SUCCESS
from ..core.records import decode_records
from ..core.storage import read_whole
from ..finished.read import normalise, private_json
from .charts import GREEN, ORANGE, RED, Charts, num
from .thumbnails import picture_rows, thumbnail

__all__ = ["load_run", "render_report"]

_MAX_ERROR_FILES = 50
_EXAMPLES = 3
_BAD_PICTURES = 12


# -- what the run left behind -----------------------------------------------------------
def load_run(out: str) -> dict[str, Any]:
    """The report, statistics, job, manifest and a sample of error records of an output."""
    where = normalise(out)
    report = private_json(where, "report.json")
    if report is None:
        raise OutputError(f"{where}: no _bulkinfer/report.json: not a bulkinfer output, or no run finished here yet")
    manifest_bytes = read_whole(f"{where}/{SUCCESS}")
    manifest = json.loads(manifest_bytes) if manifest_bytes else None
    errors: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], list[str]] = {}
    bad_rows: list[dict[str, Any]] = []  # error records with an id: a picture job shows them
    names = (manifest or {}).get("error_files", [])[:_MAX_ERROR_FILES]
    for name in names:
        data = read_whole(f"{where}/{name}") or b""
        for rec in decode_records(data):
            key = (rec.stage, rec.error_type)
            errors[key] += rec.rows
            ex = examples.setdefault(key, [])
            if len(ex) < _EXAMPLES:
                ex.append(rec.headline())
            if rec.id is not None and len(bad_rows) < _BAD_PICTURES:
                bad_rows.append({"id": rec.id, "message": rec.message})
    job = private_json(where, "job.json") or {}
    parts = [f["name"] for f in (manifest or {}).get("files", [])]
    return {
        "output": where,
        "report": report,
        "stats": private_json(where, "stats.json"),
        "job": job,
        "pictures": picture_rows(where, job, parts),
        "bad_pictures": bad_rows,
        "manifest": manifest,
        "errors": [
            {"stage": s, "type": t, "rows": n, "examples": examples[(s, t)]} for (s, t), n in errors.most_common()
        ],
        "errors_sampled": len(names) < len((manifest or {}).get("error_files", [])),
        "errors_dir": f"{where}/{ERRORS}",
    }


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{c if isinstance(c, _Raw) else num(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


class _Raw(str):
    """Cell content that is already HTML."""


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{body}</section>'


def _chart(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


# -- sections -------------------------------------------------------------------------------
def _summary(run: Mapping[str, Any]) -> str:
    r, job = run["report"], run["job"]
    model = job.get("model", {})
    status = r["status"]
    badge = {"complete": GREEN, "interrupted": ORANGE}.get(status, RED)
    drift = r.get("drift")
    facts = [
        ("status", _Raw(f'<span class="badge" style="background:{badge}">{html.escape(status)}</span>')),
        ("rows written", r["rows_out"]),
        ("rows failed", r["rows_failed"]),
        ("rows already committed before this run", r["rows_already_done"]),
        ("throughput", _Raw(f"{num(r['rows_per_s'])} rows/s inferred, {num(_written(r))} rows/s written")),
        ("wall time", _Raw(f"{num(r['wall_s'])} s (set-up {num(r['setup_s'])} s)")),
        ("model", f"{model.get('kind', r.get('model_kind'))} {model.get('location', '')}"),
        ("engine / precision", f"{r.get('engine')} / {r.get('precision')}"),
        ("job fingerprint", r.get("job_fingerprint")),
    ]
    if drift:
        facts.append(
            (
                "drift against baseline",
                _Raw(
                    f'<span class="badge" style="background:{RED if drift["status"] == "drift" else GREEN}">'
                    f"{html.escape(drift['status'])}</span> worst PSI {num(drift.get('worst_psi'))}"
                ),
            )
        )
    return _table(facts)


def _written(r: Mapping[str, Any]) -> float:
    """Rows written per second (a report from before the split has only ``rows_per_s``)."""
    return float(r.get("rows_written_per_s", r["rows_per_s"]))


def _stages(r: Mapping[str, Any], charts: Charts) -> str:
    """Where the time went: each stage's busy share (charted when any was measurable) and seconds."""
    shares = r.get("time_share", {})
    stage_rows = [(s, r["time_s"][s], 100 * shares[s]) for s in shares]
    wait = [("inference waited for input (s)", r.get("wait_for_input_s"))]
    if any(v >= 0.0005 for v in shares.values()):
        stage_svg = charts.bars(list(shares), [100 * v for v in shares.values()], "Busy time per stage", unit="%")
        caption = "Share of the run each stage was busy (stages overlap, so shares can add up to more than 100%)."
        body = _chart(stage_svg, caption)
    else:  # a remote Batch API's run: the work was done elsewhere, nothing here to chart
        body = (
            "<p>No stage of this run was busy here for a measurable share of it (a remote Batch API did the work).</p>"
        )
    body += _table(stage_rows, ["stage", "busy s", "share %"]) + _table(wait)
    return _section("Where the time went", f'<div class="row">{body}</div>', "stages")


def _run_sections(run: Mapping[str, Any], charts: Charts) -> list[str]:
    r = run["report"]
    out = [_section("Summary", _summary(run), "summary")]

    timeline = r.get("timeline") or []
    xs, ys = [], []
    for (t0, n0), (t1, n1) in itertools.pairwise(timeline[1:]):  # from the first commit: set-up is not throughput
        if t1 > t0:
            xs.append(round(t1, 2))
            ys.append((n1 - n0) / (t1 - t0))
    if len(xs) >= 2:  # a line needs two points; one would be a dot that says less than the mean below
        svg = charts.line(xs, ys, "Throughput over time", "seconds since the run started", "rows/s")
        body = _chart(svg, f"Rows written per second between commits; mean {num(_written(r))} rows/s.")
    else:
        commits = max(len(timeline) - 1, 0)
        body = (
            f"<p>{commits} commit(s): too few to chart the rate over time; the run's mean is "
            f"{num(_written(r))} rows/s written.</p>"
        )
    out.append(_section("Throughput", body, "throughput"))
    out.append(_stages(r, charts))

    b = r.get("batches", {})
    hist = b.get("histogram") or {}
    if hist:
        svg = charts.bars(list(hist), list(hist.values()), "Model calls by batch size (rows)", horizontal=False)
        rows = [
            ("model calls", b.get("count")),
            ("mean rows per call", b.get("mean_rows")),
            ("padding ratio (padded / real tokens)", b.get("padding_ratio")),
        ]
        body = _chart(svg, "How many model calls had each batch size.") + _table(rows)
        out.append(_section("Batches", f'<div class="row">{body}</div>', "batches"))

    q = r.get("quality")
    if q:
        out.append(
            _section("Quality gate", _table(sorted((k, v) for k, v in q.items() if not isinstance(v, dict))), "quality")
        )

    cost = r.get("cost", {})
    cost_rows = [(k.replace("_", " "), v) for k, v in cost.items() if not isinstance(v, dict)]
    cost_rows += [(f"label {k}", v) for k, v in (cost.get("labels") or {}).items()]
    out.append(_section("Cost", _table(cost_rows), "cost"))

    out.append(_section("Errors", _errors(run), "errors"))
    if run.get("pictures") is not None:
        out.append(_section("Pictures", _pictures(run), "pictures"))
    out.extend(_stats_sections(run, charts))
    return out


def _errors(run: Mapping[str, Any]) -> str:
    """The errors by stage and type, with examples, and where all the records are."""
    if not run["errors"]:
        return "<p>No row failed.</p>"
    error_rows: list[tuple[Any, ...]] = [
        (e["stage"], e["type"], e["rows"], _Raw("<br>".join(html.escape(x) for x in e["examples"])))
        for e in run["errors"]
    ]
    note = (
        f"<p>All records: <code>{html.escape(run['errors_dir'])}/</code>"
        + (f" (the first {_MAX_ERROR_FILES} error files are summarised here)" if run["errors_sampled"] else "")
        + "</p>"
    )
    return _table(error_rows, ["stage", "type", "rows", "examples"]) + note


def _figure(job: Mapping[str, Any], row: Mapping[str, Any], caption: str) -> str:
    uri = thumbnail(job, row)
    shown = (
        f'<img src="{uri}" alt="{html.escape(str(row.get("id")))}">' if uri else '<div class="nopic">not shown</div>'
    )
    return f'<figure class="thumb">{shown}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _pictures(run: Mapping[str, Any]) -> str:
    """The best-scored rows of each label and the error rows, as small pictures."""
    job, blocks = run["job"], []
    for label, rows in run["pictures"].items():
        figures = "".join(_figure(job, r, f"{r['id']}: {r['score']:.3f}") for r in rows)
        blocks.append(f'<h3>{html.escape(label)} <small>highest scores</small></h3><div class="thumbs">{figures}</div>')
    if not run["pictures"]:
        blocks.append("<p>No row has a label with a score.</p>")
    if run["bad_pictures"]:
        figures = "".join(_figure(job, r, r["message"]) for r in run["bad_pictures"])
        blocks.append(
            f'<h3>Error rows <small>first {len(run["bad_pictures"])}</small></h3><div class="thumbs">{figures}</div>'
        )
    return "".join(blocks)


def _stats_sections(run: Mapping[str, Any], charts: Charts) -> list[str]:
    stats = run["stats"]
    if not stats:
        return [
            _section(
                "Output statistics",
                "<p>No stats.json (written by bulkinfer since column statistics were added).</p>",
                "stats",
            )
        ]
    blocks = [_column_block(name, col, charts) for name, col in stats["columns"].items()]
    out = [_section("Output statistics", "".join(blocks), "stats")]
    drift = run["report"].get("drift")
    if drift and drift.get("columns"):
        out.append(_drift_section(drift, charts))
    return out


def _column_block(name: str, col: Mapping[str, Any], charts: Charts) -> str:
    """One output column: its facts, and the chart its kind has (classes, quantiles, norms)."""
    kind = col["kind"]
    keys = ("count", "nulls", "nan", "inf", "nonfinite", "dim", "mean", "std", "min", "max")
    facts = [(k, col.get(k)) for k in keys if k in col]
    chart = ""
    constant = (kind == "label" and len(col.get("classes") or {}) == 1) or (
        kind == "number" and col.get("quantiles") and col.get("min") == col.get("max")
    )
    if constant:  # one value in every row (completion_tokens of an embedding job): said, not charted
        value = next(iter(col["classes"])) if kind == "label" else num(col.get("min"))
        chart = f"<p>Every row holds {html.escape(str(value))}: nothing to chart.</p>"
    elif kind == "label" and col.get("classes"):
        classes = dict(list(col["classes"].items())[:20])
        total = sum(col["classes"].values()) or 1
        shares = [100 * v / total for v in classes.values()]
        chart = _chart(
            charts.bars(list(classes), shares, f"{name}: share of rows per class", unit="%"),
            "The 20 most frequent classes." if len(col["classes"]) > 20 else "Every class.",
        )
    elif kind == "number" and col.get("quantiles"):
        chart = _chart(charts.quantiles({name: col["quantiles"]}, f"{name}: quantiles"), "p1 to p99.")
    elif kind == "vector" and col.get("norm", {}).get("quantiles"):
        n = col["norm"]
        facts += [("norm mean", n["mean"]), ("norm std", n["std"]), ("norm min", n["min"]), ("norm max", n["max"])]
        chart = _chart(
            charts.quantiles({f"{name} norm": n["quantiles"]}, f"{name}: vector norm quantiles"),
            "Quantiles of each row's L2 norm.",
        )
    return f'<h3>{html.escape(name)} <small>{kind}</small></h3><div class="row">{chart}{_table(facts)}</div>'


def _drift_section(drift: Mapping[str, Any], charts: Charts) -> str:
    """PSI per column against the baseline, and each column's shift figures."""
    cols = [n for n, d in drift["columns"].items() if d.get("psi") is not None]
    svg = charts.bars(
        cols,
        [drift["columns"][n]["psi"] for n in cols],
        f"PSI against the baseline (dashed: max_psi {num(drift['max_psi'])})",
        color=ORANGE,
        limit=drift["max_psi"],
    )
    rows = [
        (
            n,
            d.get("psi"),
            d.get("mean_shift", d.get("norm_shift")),
            d.get("mean_vector_cosine"),
            ", ".join(d.get("new_classes", [])) or None,
        )
        for n, d in drift["columns"].items()
    ]
    body = _chart(svg, "Population stability index per column; over the dashed line counts as drift.")
    body += _table(rows, ["column", "PSI", "mean / norm shift", "mean-vector cosine", "new classes"])
    return _section("Drift", body, "drift")


def _compare_sections(cmp: Mapping[str, Any], charts: Charts) -> list[str]:
    head = [
        ("OLD", cmp["old"]),
        ("NEW", cmp["new"]),
        ("rows compared", cmp["rows_compared"]),
        ("only in OLD", cmp["only_in_old"]),
        ("only in NEW", cmp["only_in_new"]),
        ("failed in OLD / NEW", f"{cmp['failed_old']} / {cmp['failed_new']}"),
    ]
    blocks = [_table(head)]
    for name, col in cmp["columns"].items():
        if col["kind"] == "vector":
            cos = col.get("cosine")
            if cos:
                keys = ["min", "p1", "p5", "p50", "mean"]
                svg = charts.bars(keys, [cos[k] for k in keys], f"{name}: cosine of OLD and NEW vectors")
            facts = _table(
                [
                    ("top-K overlap", col.get("topk_overlap")),
                    ("K", col.get("k")),
                    ("queries", col.get("queries")),
                    ("note", col.get("cosine_note")),
                ]
            )
            chart = _chart(svg, "Row-wise cosine between each row's old and new vector.") if cos else ""
            blocks.append(f'<h3>{html.escape(name)} <small>vector</small></h3><div class="row">{chart}{facts}</div>')
        elif col["kind"] == "label" and col.get("confusion"):
            classes = col["classes"]
            values = [[col["confusion"][o][n] for n in classes] for o in classes]
            chart = _chart(
                charts.heatmap(classes, classes, values, f"{name}: OLD label vs NEW label"),
                f"Agreement {num(col['agreement'])}; off-diagonal cells are flips.",
            )
            blocks.append(f'<h3>{html.escape(name)} <small>label</small></h3><div class="row">{chart}</div>')
        elif col["kind"] == "number":
            title = f"{name}: quantiles, OLD (grey) and NEW (blue)"
            svg = charts.quantiles({"OLD": col.get("quantiles_old"), "NEW": col.get("quantiles_new")}, title)
            figs = ("mean_old", "mean_new", "mean_shift", "mean_abs_diff", "ks", "psi")
            body = _chart(svg, "The two distributions' quantile profiles.") + _table([(k, col.get(k)) for k in figs])
            blocks.append(f'<h3>{html.escape(name)} <small>number</small></h3><div class="row">{body}</div>')
    gate = cmp.get("gate")
    if gate:
        verdict = "FAILED" if gate["failed"] else "passed"
        blocks.append(f"<p>Gate <code>{html.escape(gate['fail_if'])}</code>: <b>{verdict}</b></p>")
    return [_section("Canary comparison", "".join(blocks), "compare")]


_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;margin:0;background:#f5f6f8}
main{max-width:1060px;margin:0 auto;padding:24px}
header{background:#1d2330;color:#fff;padding:18px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;color:#c8ccd4;font-size:13px}
nav{margin-top:8px;font-size:13px} nav a{color:#9cc3ff;margin-right:14px;text-decoration:none}
section{background:#fff;border-radius:8px;padding:16px 20px;margin:16px 0;box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:17px;margin:0 0 10px} h3{font-size:15px;margin:18px 0 6px} h3 small{color:#8a8f98;font-weight:400}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
td,th{border-bottom:1px solid #e4e6ea;padding:4px 12px 4px 0;text-align:left;vertical-align:top}
td:nth-child(n+2){font-variant-numeric:tabular-nums}
.row{display:flex;gap:20px;align-items:flex-start;flex-wrap:wrap} .row figure{flex:1 1 560px}
figure{margin:8px 0} figcaption{font-size:12px;color:#5b6270} svg.chart{max-width:100%;height:auto}
.badge{color:#fff;border-radius:4px;padding:1px 8px;font-size:13px} code{font-size:12px}
.thumbs{display:flex;flex-wrap:wrap;gap:10px} figure.thumb{width:170px;margin:0} figure.thumb img{max-width:160px}
.nopic{width:160px;height:90px;background:#eceef2;color:#8a8f98;display:flex;align-items:center;justify-content:center}
figure.thumb figcaption{word-break:break-all}
"""


def render_report(run: Mapping[str, Any], comparison: Mapping[str, Any] | None = None) -> str:
    """The HTML page (one string: styles inline, charts as inline SVG, nothing fetched)."""
    charts = Charts()
    sections = _run_sections(run, charts)
    if comparison is not None:
        sections.extend(_compare_sections(comparison, charts))
    links = "".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (
            ("summary", "Summary"),
            ("throughput", "Throughput"),
            ("stages", "Time"),
            ("errors", "Errors"),
            ("pictures", "Pictures"),
            ("stats", "Statistics"),
            ("drift", "Drift"),
            ("compare", "Comparison"),
        )
        if f'id="{a}"' in "".join(sections)
    )
    created = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    title = f"bulkinfer run: {run['output']}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head><body>'
        f"<header><h1>{html.escape(title)}</h1><p>report made {created} from {html.escape(run['output'])}</p>"
        f"<nav>{links}</nav></header><main>{''.join(sections)}</main></body></html>"
    )
