"""Tabular models: any object with ``predict`` (and ``predict_proba``) saved with joblib.

Feature columns go from Arrow straight to one float64 numpy matrix (no per-row Python);
outputs are ``prediction`` and, for classifiers, ``proba_<class>`` per class.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError, ModelError
from .protocol import Adapter, SetupContext

__all__ = ["TabularAdapter"]

TABULAR_SUFFIXES = (".joblib", ".pkl", ".pickle")

# Classifiers whose ``predict`` is exactly ``classes_[argmax(predict_proba)]``: for them the
# label is taken from the probabilities instead of running the model a second time.
_LABEL_FROM_PROBA = {
    "lightgbm.sklearn.LGBMClassifier",
    "sklearn.ensemble._forest.RandomForestClassifier",
    "sklearn.ensemble._forest.ExtraTreesClassifier",
    "sklearn.tree._classes.DecisionTreeClassifier",
}


class TabularAdapter(Adapter):
    """Runs a joblib-saved estimator (scikit-learn, LightGBM, XGBoost's sklearn API...)."""

    batch_size_hint = 65536  # one call per window: per-call overhead dwarfs per-row cost

    def __init__(self, model_path: str | Path, feature_columns: Sequence[str] = ()) -> None:
        import joblib

        self.model_path = Path(model_path)
        try:
            self.model = joblib.load(self.model_path)
        except Exception as exc:  # joblib/pickle raise anything a class's __setstate__ raises
            raise ModelError(f"{model_path}: cannot load the model ({type(exc).__name__}: {exc})") from exc
        if not hasattr(self.model, "predict"):
            raise ModelError(f"{model_path}: the object has no predict method")
        names = list(feature_columns) or [str(n) for n in getattr(self.model, "feature_names_in_", [])]
        if not names:
            raise ConfigError(
                f"model.feature_columns: {model_path} does not record its feature names; "
                "list them with --feature-columns a,b,c"
            )
        self.input_columns = tuple(names)
        classes = getattr(self.model, "classes_", None)
        self.classes = None if classes is None or not hasattr(self.model, "predict_proba") else list(classes)
        kind = f"{type(self.model).__module__}.{type(self.model).__qualname__}"
        single_output = getattr(self.model, "n_outputs_", 1) == 1
        self.label_from_proba = self.classes is not None and kind in _LABEL_FROM_PROBA and single_output

    def setup(self, ctx: SetupContext) -> None:
        if hasattr(self.model, "n_jobs"):
            with contextlib.suppress(ValueError, AttributeError):
                self.model.set_params(n_jobs=ctx.threads)

    def preprocess(self, table: pa.Table) -> np.ndarray:
        cols = []
        for name in self.input_columns:
            col = table.column(name)
            if not (
                pa.types.is_integer(col.type)
                or pa.types.is_floating(col.type)
                or pa.types.is_boolean(col.type)
                or pa.types.is_null(col.type)
            ):
                raise ModelError(f"feature column {name!r} has type {col.type}; tabular models need numbers")
            cols.append(col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
        if not cols:
            return np.empty((table.num_rows, 0))
        return np.column_stack(cols)

    def predict(self, batch: np.ndarray) -> dict[str, Any]:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*feature names.*")
            if self.label_from_proba:
                proba = np.asarray(self.model.predict_proba(batch))
                return {"prediction": np.asarray(self.model.classes_).take(np.argmax(proba, axis=1)), "proba": proba}
            out: dict[str, Any] = {"prediction": np.asarray(self.model.predict(batch))}
            if self.classes is not None:
                out["proba"] = np.asarray(self.model.predict_proba(batch))
        return out

    def postprocess(self, outputs: dict[str, Any]) -> Mapping[str, Any]:
        cols: dict[str, Any] = {"prediction": outputs["prediction"]}
        if "proba" in outputs and self.classes is not None:
            for i, cls in enumerate(self.classes):
                cols[f"proba_{cls}"] = outputs["proba"][:, i]
        return cols
