"""``bulkinfer serve``: the job's model behind HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import load_config
from ..core.errors import BulkinferError
from .common import (
    FeatureColumnsOption,
    ModelOption,
    QuietOption,
    TextColumnOption,
    fail,
    prepare,
    split_list,
)


def serve(
    config: Annotated[Path | None, typer.Argument(help="Job file (TOML): its model, engine and precision.")] = None,
    model: ModelOption = None,
    text_column: TextColumnOption = None,
    feature_columns: FeatureColumnsOption = None,
    id_column: Annotated[str | None, typer.Option(help="Row id column, echoed in answers when sent.")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 8000; 0: any free port).")] = None,
    k: Annotated[int | None, typer.Option("--k", help="kNN models: the most neighbours a search returns.")] = None,
    batches: Annotated[
        str | None,
        typer.Option(help="Folder of the batch service: accept OpenAI Batch jobs on /v1/files and /v1/batches."),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Any config field: --set serve.max_batch_size=32.")
    ] = None,
    quiet: QuietOption = False,
) -> None:
    """Answer online requests with the job's model: POST /v1/predict, /v1/embeddings (OpenAI-compatible)."""
    prepare(quiet)
    overrides: dict[str, Any] = {
        "model.name": model,
        "model.text_column": text_column,
        "model.feature_columns": split_list(feature_columns),
        "source.id_column": id_column,
        "serve.host": host,
        "serve.port": port,
        "model.options.k": k,
        "serve.batches": batches,
    }
    from ..serve import serve as run_server

    try:
        run_server(load_config(config, overrides, set_))
    except BulkinferError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
