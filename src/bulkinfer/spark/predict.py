"""``bulkinfer.spark.predict``: a model's outputs as new columns of a user's own DataFrame.

On the driver: the model is resolved and its settings decided once (engine, precision, batch
size), the quality gate of a lowered precision runs on a sample of the DataFrame, and the output
columns' types are read off the adapter's own answer (the types of a job's Parquet output; a
fixed-size vector becomes Spark's ``array<float>``). On the executors, through ``mapInArrow``: each
Python worker sets the adapter up once and keeps it from task to task, and each Arrow batch goes
through bulkinfer's batching (calls of ``runtime.rows_per_call`` rows, cut by length). A row that
fails gets null outputs and its error in the error column; the task goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..adapters import Adapter, RowsRejected, build_adapter, job_setup_context, predict_table, resolve_model
from ..adapters.custom import add_import_paths
from ..config import JobConfig, load_config
from ..config.model import ModelConfig
from ..config.runtime import RuntimeConfig
from ..core.batching import bisect_call
from ..core.errors import ConfigError
from ..precision.gate import sample_figures
from ..precision.settle import after_gate, settle
from .session import pyspark_module, workers_python

__all__ = ["predict"]

log = logging.getLogger("bulkinfer")

_ADAPTER: dict[str, Adapter] = {}
"""This Python worker's set-up adapter, by settled config (kept from task to task)."""


def predict(
    df: Any,
    model: str,
    *,
    text_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    error_column: str = "_error",
    **settings: Any,
) -> Any:
    """``df``'s columns plus ``model``'s outputs, and ``error_column`` (null, or why the row failed).

    ``settings``: any ``[model]`` or ``[runtime]`` setting of a job, by its name (``precision="int8"``,
    ``batch_size=64``, ``max_tokens=128``) or dotted (``runtime.precision``). Nothing runs until
    Spark evaluates the result (but the gate's sample and one row, read here to fix the schema)."""
    if (text_column is None) == (feature_columns is None):
        raise ConfigError("bulkinfer.spark.predict: give text_column (a text model) or feature_columns (a tabular one)")
    cfg = _config(model, text_column, feature_columns, settings)
    settled = settle(cfg, online=True)
    cfg, adapter = settled.cfg, settled.adapter
    inputs = list(adapter.input_columns)
    missing = [c for c in inputs if c not in df.columns]
    if missing:
        raise ConfigError(f"bulkinfer.spark.predict: the DataFrame has no column {missing[0]!r} (it has {df.columns})")
    sample = _sample(df, inputs, cfg.runtime.quality_sample_rows if cfg.runtime.precision != "fp32" else 1)
    adapter.setup(job_setup_context(cfg))
    try:
        if cfg.runtime.precision != "fp32":
            figures = sample_figures(cfg, adapter, settled.model, sample)
            log.info("bulkinfer.spark.predict: quality gate passed (%s)", figures)
            cfg = after_gate(cfg, figures)
        probe = sample.slice(0, 1) if sample.num_rows else _placeholder(sample.schema)
        types = {name: _spark_arrow_type(col.type) for name, col in predict_table(adapter, probe, 1).items()}
    finally:
        adapter.close()
    clash = [c for c in (*types, error_column) if c in df.columns]
    if clash:
        raise ConfigError(
            f"bulkinfer.spark.predict: the DataFrame already has a column {clash[0]!r}; rename it "
            "(or pass error_column=...)"
        )
    schema = _spark_schema(df.schema, types, error_column)
    cfg_json = cfg.model_dump(mode="json")
    paths = [os.getcwd(), *sys.path]  # a custom model's module imports on a local master's workers

    size = cfg.runtime.rows_per_call

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        add_import_paths(paths)
        adapter = _task_adapter(cfg_json)
        for batch in batches:
            yield _with_outputs(adapter, batch, size, types, error_column)

    with warnings.catch_warnings():  # PySpark's note on the pandas version: its pandas API is not used
        warnings.simplefilter("ignore", FutureWarning)
        workers_python(df.sparkSession)
        return df.mapInArrow(run, schema)


def _config(model: str, text_column: str | None, feature_columns: Sequence[str] | None,
            settings: Mapping[str, Any]) -> JobConfig:  # fmt: skip
    if Path(model).exists():  # a model file or folder: the same one wherever the executors' working directory is
        model = str(Path(model).resolve())
    overrides: dict[str, Any] = {"model.name": model, "model.text_column": text_column}
    if feature_columns is not None:
        overrides["model.feature_columns"] = list(feature_columns)
    if text_column is not None and "truncate" not in settings and "model.truncate" not in settings:
        overrides["model.truncate"] = True  # as a job: a long text is cut at the model's limit, not failed
    for key, value in settings.items():
        if "." in key:
            overrides[key] = value
        elif key in ModelConfig.model_fields:
            overrides[f"model.{key}"] = value
        elif key in RuntimeConfig.model_fields:
            overrides[f"runtime.{key}"] = value
        else:
            raise ConfigError(
                f"bulkinfer.spark.predict: unknown setting {key!r} (a [model] or [runtime] setting, or section.name)"
            )
    return load_config(overrides=overrides)


def _sample(df: Any, columns: list[str], n: int) -> pa.Table:
    """``n`` rows of ``df``'s input columns, for the gate and the output types."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        table: pa.Table = df.select(*columns).limit(n).toArrow()
    return table


def _placeholder(schema: pa.Schema) -> pa.Table:
    """One made-up row of ``schema`` (an empty DataFrame still needs its output types)."""
    values = {f.name: pa.array(["x" if pa.types.is_string(f.type) or pa.types.is_large_string(f.type) else 0])
              for f in schema}  # fmt: skip
    return pa.table({f.name: values[f.name].cast(f.type) for f in schema})


def _spark_arrow_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type Spark takes for an output column: a fixed-size vector as a plain list."""
    if pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        return pa.list_(_spark_arrow_type(t.value_type))
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_dictionary(t):
        return _spark_arrow_type(t.value_type)
    return t


def _spark_schema(base: Any, types: Mapping[str, pa.DataType], error_column: str) -> Any:
    pyspark_module()
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    fields = list(base.fields)
    fields += [StructField(name, from_arrow_type(t), nullable=True) for name, t in types.items()]
    fields.append(StructField(error_column, StringType(), nullable=True))
    return StructType(fields)


def _task_adapter(cfg_json: dict[str, Any]) -> Adapter:
    """The adapter this Python worker keeps for ``cfg_json`` (set up on its first batch)."""
    key = hashlib.sha256(json.dumps(cfg_json, sort_keys=True, default=str).encode()).hexdigest()
    adapter = _ADAPTER.get(key)
    if adapter is None:
        for old in _ADAPTER.values():  # another model: one at a time per worker
            old.close()
        _ADAPTER.clear()
        cfg = JobConfig.model_validate(cfg_json)
        adapter = build_adapter(cfg, resolve_model(cfg))
        adapter.setup(job_setup_context(cfg, threads=_task_cpus()))
        _ADAPTER[key] = adapter
    return adapter


def _task_cpus() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    cpus = ctx.cpus() if ctx is not None else 1
    return max(1, int(cpus))


def _with_outputs(adapter: Adapter, batch: pa.RecordBatch, size: int, types: Mapping[str, pa.DataType],
                  error_column: str) -> pa.RecordBatch:  # fmt: skip
    table = pa.Table.from_batches([batch])
    columns, errors = _isolated(adapter, table.select(list(adapter.input_columns)), size, types)
    arrays = [*batch.columns, *(columns[name] for name in types), pa.array(errors, pa.string())]
    names = [*batch.schema.names, *types, error_column]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _isolated(adapter: Adapter, table: pa.Table, size: int,
              types: Mapping[str, pa.DataType]) -> tuple[dict[str, pa.Array], list[str | None]]:  # fmt: skip
    """Outputs of ``table``'s rows, a failing row's as nulls with its error: the whole table in one
    go when it runs, else bisected down to the rows that fail alone (``core.batching.bisect_call``,
    as a job's batches are); rows the adapter rejects up front are set aside at once."""
    n = table.num_rows
    try:
        return _outputs(adapter, table, size, types), [None] * n
    except RowsRejected as rejected:  # rows the adapter will not run: their errors, the others again
        keep = [i for i in range(n) if i not in rejected.errors]
        columns, kept_errors = _isolated(adapter, table.take(keep), size, types)
        where = {row: k for k, row in enumerate(keep)}
        take = pa.array([where.get(i) for i in range(n)], pa.int64())
        said = [kept_errors[where[i]] if i in where else _error(rejected.errors[i]) for i in range(n)]
        return {name: col.take(take) for name, col in columns.items()}, said
    except Exception:
        pass
    done, failed = bisect_call(
        np.arange(n), lambda idx: _outputs(adapter, table.take(pa.array(idx)), size, types), known_bad=True
    )
    errors: list[str | None] = [None] * n
    for row, exc in failed:
        errors[row] = _error(exc)
    at = np.full(n, -1, dtype=np.int64)  # each row's place in the pieces joined, -1: failed
    joined = np.concatenate([idx for idx, _ in done]) if done else np.empty(0, np.int64)
    at[joined] = np.arange(len(joined))
    take = pa.array(at, mask=at < 0)
    return {
        name: (pa.concat_arrays([got[name] for _, got in done]) if done else pa.array([], t)).take(take)
        for name, t in types.items()
    }, errors


def _outputs(adapter: Adapter, table: pa.Table, size: int, types: Mapping[str, pa.DataType]) -> dict[str, pa.Array]:
    got = predict_table(adapter, table, size)
    return {name: got[name].cast(t) for name, t in types.items()}


def _error(exc: BaseException) -> str:
    if isinstance(exc, RowsRejected) and len(exc.errors) == 1:  # one row, rejected up front: its own reason
        exc = next(iter(exc.errors.values()))
    return f"{type(exc).__name__}: {exc}"
