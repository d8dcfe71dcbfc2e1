"""``[sink]``: where results go."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .section import Section

SINK_FORMAT = Literal["parquet", "jsonl", "csv", "openai-batch", "delta", "zarr"]
"""The output formats (``sink.format``, ``run --format``)."""


class TopKConfig(Section):
    """``sink.top_k``: keep only the best K rows of the whole job."""

    by: str
    """The output column ranked (a number; null or NaN ranks after every number)."""
    k: int = Field(ge=1)
    """How many rows the output keeps."""
    order: Literal["desc", "asc"] = "desc"
    """desc: the highest values are the best; asc: the lowest."""


class SinkConfig(Section):
    path: str = ""
    """Output directory: a local or shared-filesystem path (or file://); not an object-store URI."""
    format: SINK_FORMAT = "parquet"
    """Output file format; openai-batch (the default for an openai-batch input): the Batch API's output lines;
    delta: the folder is a Delta Lake table, each part added in an idempotent commit; zarr (over a Zarr or NetCDF
    input): the answers' arrays in <path>/array.zarr, region by region, the per-tile rows in Parquet parts."""
    keep_columns: list[str] = Field(default_factory=list)
    """Input columns copied to the output next to the results (the id column always is)."""
    preserve_order: bool = True
    """Keep input row order within each shard's output file."""
    compression: str = "zstd"
    """Parquet compression codec."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options of an object-store path (s3: endpoint_url, key, secret, profile, client_kwargs...)."""
    input_hash: bool | None = None
    """Write each row's input hash (_input_hash, 8 bytes a row) beside its results, so a later run can be
    incremental from this output (--incremental-from). Default: on when source.id_column is set and the
    output is Parquet (an output being resumed keeps its first run's choice); always on in an incremental run."""
    mode: Literal["snapshot", "delta"] = "snapshot"
    """snapshot: every row; delta (with source.previous): only new and changed rows, plus _deleted.parquet."""
    top_k: TopKConfig | None = None
    """{by, k, order}: keep only the K best rows of the whole job by the column `by` (ties: the lower
    source.id_column first), each with its rank in `top_k_rank` (1 = best); each shard commits its own best K
    and the finish step keeps the job's (docs/science.md#the-best-k-of-everything)."""
