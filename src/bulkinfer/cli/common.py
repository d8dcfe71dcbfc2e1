"""What every command shares: the Typer app, logging as one line per message, the options
``run`` and ``serve`` share, and errors mapped to exit codes."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import field_docs
from ..core.errors import BulkinferError, Interrupted
from ..core.hardware import quiet_tokenizers

__all__ = ["LineFormat", "app", "fail", "fields_epilog", "prepare", "setup_logging", "split_list", "stored_config"]


def fields_epilog() -> str:
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


def _print_version(value: bool) -> None:
    if value:
        from .._version import __version__

        typer.echo(f"bulkinfer {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Offline batch inference: big batches, exactly-once output, resume after any crash."""


_CSV = {"help": "Comma-separated list."}


def split_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def prepare(quiet: bool) -> None:
    """Offline model hub, quiet tokenizers, and log lines on stderr."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_tokenizers()
    setup_logging(quiet)


class LineFormat(logging.Formatter):
    """``bulkinfer: <message>``; a library's own warning names the library (``bulkinfer: [ray] ...``)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name == "bulkinfer" or record.name.startswith("bulkinfer."):
            return f"bulkinfer: {record.getMessage()}"
        source = record.name.split(".")[0]
        if source == "root":  # a library that logs on the root logger: named by where its file is installed
            found = re.search(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)", record.pathname)
            source = found.group(1).removesuffix(".py") if found else "python"
        return f"bulkinfer: [{source}] {record.getMessage()}"


def setup_logging(quiet: bool) -> None:
    """bulkinfer's lines at INFO (WARNING with -q) on stderr; the libraries it drives only from
    WARNING up, so a quantizer's or an exporter's progress chatter stays out of the job's log."""
    if not logging.root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(LineFormat())
        logging.root.addHandler(handler)
        logging.root.setLevel(logging.WARNING)
    logging.getLogger("bulkinfer").setLevel(logging.WARNING if quiet else logging.INFO)


def stored_config(out: Path) -> tuple[dict[str, Any], list[str]]:
    """The config a finished run stored, and its input files as absolute URIs."""
    from ..commit.ledger import Ledger
    from ..core.errors import OutputError

    plan = Ledger(out).read_plan()
    if plan is None:
        raise OutputError(f"{out}: not a bulkinfer output directory (no _bulkinfer/job.json)")
    return plan.config, [f.uri for f in plan.inputs]


def fail(exc: BulkinferError) -> typer.Exit:
    """The one line a user's error prints (a stop that a rerun resumes, exit 75, is not an error)."""
    typer.echo(f"bulkinfer: {'stopped' if isinstance(exc, Interrupted) else 'error'}: {exc}", err=True)
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
