"""Molecules: a model fed the features of each row's SMILES (``model.featurize``).

The featuriser runs in ``preprocess`` (so beside inference, never in the model's thread; a job's
large windows in spawned processes, see :meth:`Featurizer.use_processes`): RDKit parses each
SMILES, then either Morgan bits (``morgan``: one ``GetFingerprintAsNumPy`` per molecule into a
preallocated ``uint8`` matrix) or the named RDKit descriptors (``descriptors``) make one float
matrix for the model. A SMILES RDKit cannot parse is rejected alone (an error row naming it); the
others run. The model is a joblib estimator (scikit-learn, LightGBM...) or an ``.onnx`` graph with
one 2-D input; its feature count is checked against the featuriser's before any row runs.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError
from ..core.tensors import tensor_column
from ..core.threads import processes
from .protocol import Adapter, RowsRejected, SetupContext, Wrapped

__all__ = ["Featurized", "Featurizer", "MoleculeError", "featurizer"]


class MoleculeError(ValueError):
    """A row's SMILES that RDKit cannot parse."""


POOL_CHUNK = 2048
"""SMILES per task of the featuriser's processes (4 MB of Morgan bits back per task)."""


class Featurizer:
    """SMILES to one feature matrix; ``names``: the features, in the model's order. ``spec``
    (what :func:`featurizer` was given) lets worker processes make the same featuriser."""

    def __init__(
        self, names: Sequence[str], one: Callable[[Any], np.ndarray], dtype: type, spec: tuple[Any, ...] = ()
    ) -> None:
        self.names, self._one, self._dtype, self.spec = list(names), one, dtype, spec
        self._processes = 1
        self._pool: Any = None
        self._lock = threading.Lock()

    def use_processes(self, n: int) -> None:
        """Featurise calls of many SMILES in ``n`` processes: RDKit holds the interpreter while it
        parses, so threads would take turns; the processes start at the first such call."""
        self._processes = n if self.spec else 1

    def __call__(self, smiles: Sequence[str | None]) -> np.ndarray:
        if self._processes > 1 and len(smiles) >= 2 * POOL_CHUNK:
            out, bad = self._in_processes(smiles)
        else:
            out, bad = self.matrix(smiles)
        if bad:
            raise RowsRejected({i: MoleculeError(message) for i, message in bad.items()})
        return out

    def matrix(self, smiles: Sequence[str | None]) -> tuple[np.ndarray, dict[int, str]]:
        """The features of each SMILES here, and why each one that cannot be parsed was not."""
        from rdkit import Chem

        out: np.ndarray = np.zeros((len(smiles), len(self.names)), self._dtype)
        bad: dict[int, str] = {}
        for i, text in enumerate(smiles):
            mol = Chem.MolFromSmiles(text) if text else None
            if mol is None:
                bad[i] = f"SMILES {text!r} cannot be parsed by RDKit" if text else "no SMILES"
                continue
            out[i] = self._one(mol)
        return out, bad

    def _in_processes(self, smiles: Sequence[str | None]) -> tuple[np.ndarray, dict[int, str]]:
        with self._lock:
            if self._pool is None:
                self._pool = processes(self._processes)
        starts = range(0, len(smiles), POOL_CHUNK)
        chunks = [list(smiles[at : at + POOL_CHUNK]) for at in starts]
        done = list(self._pool.map(_featurize_chunk, [self.spec] * len(chunks), chunks))
        bad = {at + i: message for at, (_m, b) in zip(starts, done, strict=True) for i, message in b.items()}
        return np.concatenate([m for m, _b in done]), bad

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


_MADE: dict[tuple[Any, ...], Featurizer] = {}
"""A worker process's featurisers, made at its first task."""


def _featurize_chunk(spec: tuple[Any, ...], smiles: list[str | None]) -> tuple[np.ndarray, dict[int, str]]:
    """One task of the featuriser's processes (module level: what a spawned process can import)."""
    made = _MADE.get(spec)
    if made is None:
        made = _MADE[spec] = featurizer(*spec)
    return made.matrix(smiles)


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
        spec = (kind, radius, bits, tuple(names))
        return Featurizer([f"morgan_{i}" for i in range(bits)], generator.GetFingerprintAsNumPy, np.uint8, spec)
    from rdkit.Chem import Descriptors

    known = dict(Descriptors._descList)
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else f" (RDKit has {len(known)}: MolWt, TPSA, ...)"
            raise ConfigError(f"model.feature_columns: {name!r} is not an RDKit descriptor{hint}")
    chosen = list(names) or list(known)
    functions = [known[n] for n in chosen]
    one = lambda mol: np.array([f(mol) for f in functions], np.float64)  # noqa: E731
    return Featurizer(chosen, one, np.float64, (kind, radius, bits, tuple(names)))


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

    def setup(self, ctx: SetupContext) -> None:
        self.inner.setup(ctx)
        if ctx.threads > 1 and not ctx.online:  # a job's large windows: the parsing spread over processes
            self.features.use_processes(ctx.threads)

    def preprocess(self, table: pa.Table) -> np.ndarray:
        return self.features(table.column(self.column).to_pylist())

    def close(self) -> None:
        self.features.close()
        self.inner.close()

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
