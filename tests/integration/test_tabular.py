from __future__ import annotations

import numpy as np
import pytest

from bulkinfer import load_config, run_job
from bulkinfer.core.errors import ConfigError

from helpers import read_output, tabular_table, train_classifier, write


@pytest.mark.parametrize("kind", ["sklearn", "lightgbm"])
def test_predictions_equal_model_predict(tmp_path, kind):
    import joblib

    model_path = train_classifier(tmp_path / f"{kind}.joblib", kind)
    table = tabular_table(1500, seed=5)
    write(table, tmp_path / "in.parquet", row_group_size=200)
    cfg = load_config(
        overrides={
            "source.paths": [str(tmp_path / "in.parquet")],
            "model.name": str(model_path),
            "source.id_column": "id",
            "sink.keep_columns": ["segment"],
            "sink.path": str(tmp_path / "out"),
            "source.shard_rows": 400,
            "runtime.batch_size": 128,
            "execution.progress": "none",
        }
    )
    result = run_job(cfg)
    out = read_output(tmp_path / "out").sort_by("id")
    assert out.column_names == ["id", "segment", "prediction", "proba_no", "proba_yes", "_input_hash"]
    assert out["id"].to_pylist() == table["id"].to_pylist()
    assert out["segment"].to_pylist() == table["segment"].to_pylist()
    model = joblib.load(model_path)
    import pandas as pd

    x = pd.DataFrame({c: table[c].to_numpy() for c in ("x1", "x2", "x3")}).astype(float)
    assert out["prediction"].to_pylist() == list(model.predict(x))
    np.testing.assert_array_equal(out["proba_yes"].to_numpy(), model.predict_proba(x)[:, 1])
    assert result.report["rows_out"] == 1500 and result.report["shards"]["committed"] == 4
    # both models take the label from the probabilities (one model pass, not two): still equal to predict
    from bulkinfer.adapters.tabular import TabularAdapter

    assert TabularAdapter(model_path).label_from_proba


def test_feature_columns_required_without_names(tmp_path):
    import joblib
    from sklearn.linear_model import LinearRegression

    t = tabular_table(50)
    x = np.column_stack([t["x1"].to_numpy(), t["x2"].to_numpy()])
    joblib.dump(LinearRegression().fit(x, t["x3"].to_numpy()), tmp_path / "lr.joblib")
    write(t, tmp_path / "in.csv")
    base = {
        "source.paths": [str(tmp_path / "in.csv")],
        "model.name": str(tmp_path / "lr.joblib"),
        "sink.path": str(tmp_path / "out"),
        "execution.progress": "none",
    }
    with pytest.raises(ConfigError, match="feature_columns"):
        run_job(load_config(overrides=base))
    run_job(load_config(overrides={**base, "model.feature_columns": ["x1", "x2"]}))
    out = read_output(tmp_path / "out")
    assert out.column_names == ["prediction"]
    np.testing.assert_allclose(out["prediction"].to_numpy(), joblib.load(tmp_path / "lr.joblib").predict(x))
