"""``bulkinfer tune`` (measure candidates, write the fastest gate-passing job) and
``bulkinfer machine`` (what runs fast here)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import load_config
from ..core.errors import BulkinferError
from ..core.hardware import quiet_tokenizers
from ..engines.int8 import kept_in_words
from .common import (
    fail,
    setup_logging,
)

if TYPE_CHECKING:
    from rich.table import Table

    from ..precision.tune import TuneResult

# the flags of ``bulkinfer tune``
TuneConfigFlag = Annotated[Path | None, typer.Argument(help="Job file (TOML). Flags override it.")]
TuneInputFlag = Annotated[list[str] | None, typer.Option("--input", "-i", help="Input file, directory or glob.")]
TuneModelFlag = Annotated[str | None, typer.Option("--model", "-m", help="minilm or a model directory.")]
TuneTextColumnFlag = Annotated[str | None, typer.Option(help="Column holding the text.")]
TuneSetFlag = Annotated[
    list[str] | None, typer.Option("--set", help="Any config field, e.g. runtime.quality_floor=0.995.")
]
TuneSampleRowsFlag = Annotated[int, typer.Option(help="Rows of the input to measure on.")]
TuneBatchSizesFlag = Annotated[
    str | None, typer.Option(help="Batch sizes to try, comma-separated (default 8,16,32,64; 64..1024 on a GPU).")
]
TuneCandidatesFlag = Annotated[
    str | None,
    typer.Option(help="Engine/precision pairs to try (default all; torch's on a GPU): onnxruntime/int8,torch/fp16."),
]
TuneInt8SearchFlag = Annotated[
    bool,
    typer.Option(help="When int8 fails the gate, search the fewest blocks to keep in fp32 (several builds)."),
]
TuneOutputFlag = Annotated[Path | None, typer.Option("--output", "-o", help="Where to write the tuned job file.")]
TunePrintOnlyFlag = Annotated[bool, typer.Option("--print", help="Print the tuned job instead of writing it.")]


def tune(
    config: TuneConfigFlag = None,
    input: TuneInputFlag = None,
    model: TuneModelFlag = None,
    text_column: TuneTextColumnFlag = None,
    set_: TuneSetFlag = None,
    sample_rows: TuneSampleRowsFlag = 512,
    batch_sizes: TuneBatchSizesFlag = None,
    candidates: TuneCandidatesFlag = None,
    int8_search: TuneInt8SearchFlag = True,
    output: TuneOutputFlag = None,
    print_only: TunePrintOnlyFlag = False,
) -> None:
    """Measure engine x precision x batch size on a sample of the input; keep the fastest that passes the gate."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_tokenizers()
    setup_logging(quiet=True)
    from rich.console import Console

    from ..precision.tune import to_toml
    from ..precision.tune import tune as run_tune

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 110)
    overrides = {"source.paths": input or None, "model.name": model, "model.text_column": text_column}
    status = console.status("tune: measuring")  # progress on a terminal; the table below lists each candidate once
    try:
        status.start()
        cfg = load_config(config, overrides, set_)
        sizes = tuple(int(x) for x in (batch_sizes or "").split(",") if x.strip())
        pairs = tuple(tuple(c.strip().split("/", 1)) for c in (candidates or "").split(",") if c.strip())
        result = run_tune(
            cfg,
            sample_rows,
            sizes or None,
            precisions=pairs or None,  # type: ignore[arg-type]
            int8_search=int8_search,
            on_candidate=lambda c: status.update(f"tune: measured {c.engine} {c.precision} batch {c.batch_size}"),
        )
    except BulkinferError as exc:
        raise fail(exc) from None
    except ValueError:
        raise typer.BadParameter("--batch-sizes: expected numbers like 8,16,32") from None
    finally:
        status.stop()
    console.print(_table(result))
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


def _table(result: TuneResult) -> Table:
    """Every candidate measured, one row each, the chosen one marked."""
    from rich.table import Table

    from ..core.hardware import isa_key

    table = Table(title=f"bulkinfer tune: {result.sample_rows} rows of the job's input on {isa_key()}")
    columns = ["engine", "precision", "batch", "threads", "processes", "rows/s", "mean cosine", "top-10 overlap",
               "gate", ""]  # fmt: skip
    for col in columns:  # names are never cut: the other columns wrap first
        table.add_column(col, no_wrap=col in ("engine", "precision", "rows/s", "gate"))
    for c in result.candidates:
        q = c.quality or {}
        table.add_row(
            c.engine,
            c.precision + (f" ({kept_in_words(c.int8_fp32_groups)} fp32)" if c.int8_fp32_groups else ""),
            str(c.batch_size) if c.batch_size else "-",  # a candidate not measured here (emulated) has none
            str(c.threads) if c.batch_size else "-",
            str(c.processes) + (f" ({c.cpu_per_wall} CPU s/s)" if c.cpu_per_wall is not None else ""),
            str(c.rows_per_s or "-"),
            str(q.get("mean_cosine", "1 (fp32)" if c.precision == "fp32" else "-")),
            str(q.get("top10_overlap", "-")),
            "pass" if c.passed else ("FAIL" if c.quality else "-"),
            "<- chosen" if c is result.best else ("" if c.passed else c.note),
        )
    return table


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
    setup_logging(quiet=True)
    from ..core.hardware import survey

    found = survey(device)
    if model:
        try:
            devices = ["cpu", device] if found["gpu"] else ["cpu"]
            from ..adapters import resolve_model
            from ..precision.tune import best_measured

            cfg = load_config(None, {"model.name": model}, set_)
            found["tune"] = best_measured(cfg, resolve_model(cfg).digest, devices)
        except BulkinferError as exc:
            raise fail(exc) from None
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
