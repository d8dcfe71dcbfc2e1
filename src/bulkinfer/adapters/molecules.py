"""Molecules: a model fed the features of each row's SMILES (``model.featurize``).

The featuriser runs in ``preprocess`` (so beside inference, in the reading thread, never in
the model's): RDKit parses each SMILES, then either Morgan bits (``morgan``: one
``GetFingerprintAsNumPy`` per molecule into a preallocated ``uint8`` matrix) or the named RDKit
descriptors (``descriptors``) make one float matrix for the model. A SMILES RDKit cannot parse
is rejected alone (an error row naming it); the others run. The model is a joblib estimator
(scikit-learn, LightGBM...) or an ``.onnx`` graph with one 2-D input; its feature count is
checked against the featuriser's before any row runs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError
from ..core.tensors import tensor_column
from .protocol import Adapter, RowsRejected, Wrapped

__all__ = ["Featurized", "Featurizer", "MoleculeError", "featurizer"]


class MoleculeError(ValueError):
    """A row's SMILES that RDKit cannot parse."""


class Featurizer:
    """SMILES to one feature matrix; ``names``: the features, in the model's order."""

    def __init__(self, names: Sequence[str], one: Callable[[Any], np.ndarray], dtype: type) -> None:
        self.names, self._one, self._dtype = list(names), one, dtype

    def __call__(self, smiles: Sequence[str | None]) -> np.ndarray:
        from rdkit import Chem

        out: np.ndarray = np.zeros((len(smiles), len(self.names)), self._dtype)
        bad: dict[int, Exception] = {}
        for i, text in enumerate(smiles):
            mol = Chem.MolFromSmiles(text) if text else None
            if mol is None:
                bad[i] = MoleculeError(f"SMILES {text!r} cannot be parsed by RDKit" if text else "no SMILES")
                continue
            out[i] = self._one(mol)
        if bad:
            raise RowsRejected(bad)
        return out


def _rdkit() -> None:
    try:
        from rdkit import RDLogger
    except ImportError:
        raise ConfigError("model.featurize: needs RDKit; pip install 'bulkinfer[science]'") from None
    RDLogger.DisableLog("rdApp.*")  # type: ignore[attr-defined]  # a bad SMILES is an error row of ours, not a line on stderr


def featurizer(kind: str, radius: int, bits: int, names: Sequence[str]) -> Featurizer:
    """The featuriser ``model.featurize`` names (RDKit is imported here, not before)."""
    _rdkit()
    if kind == "morgan":
        from rdkit.Chem import rdFingerprintGenerator

        generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=bits)
        return Featurizer([f"morgan_{i}" for i in range(bits)], generator.GetFingerprintAsNumPy, np.uint8)
    from rdkit.Chem import Descriptors

    known = dict(Descriptors._descList)
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else f" (RDKit has {len(known)}: MolWt, TPSA, ...)"
            raise ConfigError(f"model.feature_columns: {name!r} is not an RDKit descriptor{hint}")
    chosen = list(names) or list(known)
    functions = [known[n] for n in chosen]
    return Featurizer(chosen, lambda mol: np.array([f(mol) for f in functions], np.float64), np.float64)


class Featurized(Wrapped):
    """``inner`` (a tabular or one-matrix ONNX adapter) fed ``features`` of the SMILES in ``column``."""

    cost = Adapter.cost  # the rows are a feature matrix of our own: sliced as any matrix, not as inner's features
    select = Adapter.select

    def __init__(self, inner: Adapter, features: Featurizer, column: str, matrix_column: str | None = None) -> None:
        super().__init__(inner)
        self.features, self.column = features, column
        self.matrix_column = matrix_column  # an ONNX model's: its one input's column, given as one tensor column
        self.input_columns = (column,)
        # a call's features as float64 (what a tree model converts them to) near 64 MB: 4,096 rows of 2,048
        # bits (a joblib model's 65,536-row calls made 1 GB matrices); a window, four calls
        self.batch_size_hint = min(inner.batch_size_hint or 4096, max(64, (64 << 20) // (8 * len(features.names))))
        self.window_rows = 4 * self.batch_size_hint

    def preprocess(self, table: pa.Table) -> np.ndarray:
        return self.features(table.column(self.column).to_pylist())

    def predict(self, batch: np.ndarray) -> Any:
        if self.matrix_column is None:
            return self.inner.predict(batch)
        return self.inner.predict(pa.table({self.matrix_column: tensor_column(batch)}))


def featurized(
    kind: str, location: str, featurize: str, column: str, radius: int, bits: int, names: Sequence[str]
) -> Featurized:
    """The ``kind`` (tabular or onnx) model at ``location`` fed ``featurize``'s features of ``column``;
    a model that takes another number of features than the featuriser makes is refused now."""
    features = featurizer(featurize, radius, bits, names)
    setting = "model.morgan_bits" if featurize == "morgan" else "model.feature_columns"
    if kind == "onnx":
        from .onnx_model import OnnxAdapter

        onnx = OnnxAdapter(location, ["features"])
        if not onnx.one_matrix:
            raise ConfigError(f"model.featurize: {location} does not take one matrix (one 2-D input) of features")
        _same_width(onnx.matrix_width(), len(features.names), location, setting)
        return Featurized(onnx, features, column, matrix_column="features")
    from .tabular import TabularAdapter

    tabular = TabularAdapter(location, features.names)
    _same_width(getattr(tabular.model, "n_features_in_", None), len(features.names), location, setting)
    return Featurized(tabular, features, column)


def _same_width(takes: int | None, makes: int, location: str, setting: str) -> None:
    if takes is not None and takes != makes:
        raise ConfigError(f"{setting}: {location} takes {takes} features; the featuriser makes {makes}")
