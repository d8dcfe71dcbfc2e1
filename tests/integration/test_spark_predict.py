"""``bulkinfer.spark.predict`` in a PySpark pipeline on a real local Spark (local[2]): the model's
outputs as columns of the user's DataFrame, equal to what ``bulkinfer run`` writes; bad rows
answered in ``_error``; settings honoured or refused."""

from __future__ import annotations

import sys
import textwrap
import uuid

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer import ConfigError, QualityGateError, load_config, run_job
from bulkinfer.spark import predict

from helpers import make_catalog, read_output, tabular_table, train_classifier, write

MODELS = textwrap.dedent("""
    import pyarrow.compute as pc

    def fails_on_13(table):
        if 13 in table["x"].to_pylist():
            raise ValueError("row 13 is bad")
        return {"y": pc.multiply(table["x"], 2), "label": pc.cast(table["x"], "string")}
""")


@pytest.fixture(scope="module")
def spark():
    from bulkinfer.spark.session import spark_session

    # one task slot: one Python worker sets each model up (the backend's tests run two)
    session, _ = spark_session("local[1]", {"spark.sql.execution.arrow.maxRecordsPerBatch": "64"})
    yield session
    session.stop()


def _df(spark, table: pa.Table):
    return spark.createDataFrame(table)  # from Arrow, as a pipeline reading Parquet would have it


def test_text_embeddings_equal_an_offline_run(tmp_path, spark):
    catalog = make_catalog(120, seed=9)
    write(catalog, tmp_path / "in.parquet")
    run_job(load_config(overrides={"source.paths": [str(tmp_path / "in.parquet")], "source.id_column": "id",
                                   "model.name": "minilm", "model.text_column": "description",
                                   "sink.path": str(tmp_path / "out"), "execution.progress": "none"}))  # fmt: skip
    df = _df(spark, catalog)
    result = predict(df, "minilm", text_column="description")
    assert result.columns == [*df.columns, "embedding", "_error"]
    assert result.schema["embedding"].dataType.simpleString() == "array<float>"
    got = result.toArrow().sort_by("id")
    offline = read_output(tmp_path / "out").sort_by("id")
    assert got.num_rows == 120 and got["_error"].null_count == 120
    assert got.select(catalog.column_names).equals(catalog.sort_by("id"))  # the user's columns untouched
    a = np.stack(offline["embedding"].to_numpy(zero_copy_only=False))
    b = np.stack(got["embedding"].to_numpy(zero_copy_only=False))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.9999


def test_tabular_outputs_equal_an_offline_run_exactly(tmp_path, spark):
    model = train_classifier(tmp_path / "model.joblib")
    t = tabular_table(500, seed=4)
    write(t, tmp_path / "in.parquet")
    run_job(load_config(overrides={"source.paths": [str(tmp_path / "in.parquet")], "source.id_column": "id",
                                   "model.name": str(model), "model.feature_columns": ["x1", "x2", "x3"],
                                   "sink.path": str(tmp_path / "out"), "execution.progress": "none"}))  # fmt: skip
    got = predict(_df(spark, t), str(model), feature_columns=["x1", "x2", "x3"]).toArrow().sort_by("id")
    offline = read_output(tmp_path / "out").sort_by("id")
    for name in ("prediction", "proba_no", "proba_yes"):
        assert got[name].to_pylist() == offline[name].to_pylist()
    assert got["_error"].null_count == 500


def test_a_failing_row_gets_nulls_and_its_error_the_task_goes_on(tmp_path, spark, monkeypatch):
    name = f"sparkpredict_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        df = spark.range(300).withColumnRenamed("id", "x")
        got = predict(df, f"{name}:fails_on_13", feature_columns=["x"], error_column="why").toArrow().sort_by("x")
    finally:
        sys.modules.pop(name, None)
    assert got.num_rows == 300
    assert got["why"].to_pylist() == [("ValueError: row 13 is bad" if i == 13 else None) for i in range(300)]
    assert got["y"].to_pylist() == [(None if i == 13 else 2 * i) for i in range(300)]
    assert got["label"].to_pylist() == [(None if i == 13 else str(i)) for i in range(300)]


def test_a_lowered_precision_is_gated_once_on_the_driver(tmp_path, spark, caplog):
    df = _df(spark, make_catalog(64, seed=2))
    with pytest.raises(QualityGateError, match="quality gate: int8 is too far from fp32"):
        predict(df, "minilm", text_column="description", precision="int8", quality_floor=0.999999,
                int8_fp32_groups=[], quality_sample_rows=32)  # fmt: skip
    caplog.set_level("INFO", logger="bulkinfer")
    result = predict(df, "minilm", text_column="description", precision="int8", quality_floor=0.9,
                     int8_fp32_groups=[], quality_sample_rows=32)  # fmt: skip
    assert result.toArrow()["_error"].null_count == 64
    # the gate ran once, here, while predict built the plan; evaluating the result ran no other
    (passed,) = [r.getMessage() for r in caplog.records if "quality gate passed" in r.getMessage()]
    assert "'precision': 'int8'" in passed and "'rows': 32" in passed


def test_settings_that_cannot_hold_are_refused(spark):
    df = _df(spark, make_catalog(5, seed=1))
    cases = [
        (dict(text_column="description", batchsize=8), "unknown setting 'batchsize'"),
        (dict(text_column="nope"), "the DataFrame has no column 'nope'"),
        (dict(text_column="description", error_column="title"), "already has a column 'title'"),
        (dict(text_column="description", feature_columns=["price"]), "give text_column"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            predict(df, "minilm", **kwargs)


def test_the_docs_example_runs_as_written(tmp_path, spark):
    import re
    from pathlib import Path

    import pyarrow.dataset as pads

    page = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    code = re.search(r"<!-- spark-example -->\n```python\n(.*?)```", page, re.S).group(1)
    write(make_catalog(40, seed=3), tmp_path / "catalog.parquet")
    # Spark resolves a relative path against its JVM's working directory (this session's: the
    # repository's), so the example's paths are made absolute; the code is the page's
    for name in ('"catalog.parquet"', '"embeddings"'):
        assert name in code
        code = code.replace(name, repr(str(tmp_path / name.strip('"'))))
    exec(compile(code, "docs/spark.md", "exec"), {})  # getOrCreate() finds this module's session
    got = pads.dataset(tmp_path / "embeddings", format="parquet").to_table().sort_by("id")
    assert got.column_names == ["id", "embedding", "_error"]
    assert got["id"].to_pylist() == list(range(40)) and got["_error"].null_count == 40
    assert {len(v) for v in got["embedding"].to_pylist()} == {384}


def test_a_text_over_the_limit_is_refused_alone_when_truncate_is_off(spark):
    catalog = make_catalog(20, seed=8)
    texts = catalog["description"].to_pylist()
    texts[7] = "word " * 3000
    df = _df(spark, catalog.set_column(catalog.schema.get_field_index("description"), "description", [texts]))
    got = predict(df, "minilm", text_column="description", truncate=False).toArrow().sort_by("id")
    errors = got["_error"].to_pylist()
    assert errors[7].startswith("ValueError: the text has ") and "over the model's limit of 256" in errors[7]
    assert [e for i, e in enumerate(errors) if i != 7] == [None] * 19
    assert got["embedding"].to_pylist()[7] is None and got["embedding"].null_count == 1
