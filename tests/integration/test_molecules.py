"""Molecules: ``model.featurize`` turns each row's SMILES into Morgan bits or RDKit descriptors
before a LightGBM, scikit-learn or ONNX model; the answers equal the model run on features
computed here the way a notebook does (RDKit's classic calls); an unparsable SMILES is an error
row naming it and its row; the docs' screening example keeps the best K of a full sort."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import joblib
import numpy as np
import onnx
import pyarrow as pa
import pytest
from onnx import TensorProto, helper, numpy_helper

from bulkinfer import ConfigError, run_job

from helpers import BULKINFER, job_config, read_output, write

pytest.importorskip("rdkit", reason="the science extra (RDKit) is not installed")
from rdkit import Chem, DataStructs
from rdkit.Chem import Descriptors, rdMolDescriptors

SCIENCE = Path(__file__).resolve().parents[2] / "docs" / "science.md"
PARTS = ["C", "CC", "C(C)", "C(O)", "C(N)", "C(F)", "C(Cl)", "C1CCCCC1", "c1ccccc1", "C(=O)O", "N", "O", "C(C)(C)"]
BAD = {7: "C1CC", 19: "not a molecule", 33: "c1cccc1X"}


def _library(n: int = 240) -> pa.Table:
    rng = np.random.default_rng(11)
    smiles = ["".join(rng.choice(PARTS, rng.integers(2, 9))) for _ in range(n)]
    for row, text in BAD.items():
        smiles[row] = text
    return pa.table({"id": np.arange(n) + 500, "smiles": smiles})


def _morgan(smiles: list[str], bits: int) -> np.ndarray:
    """Features as a notebook computes them: one molecule at a time, RDKit's classic calls."""
    rows = []
    for text in smiles:
        fp = rdMolDescriptors.GetMorganFingerprintAsBitVect(Chem.MolFromSmiles(text), 2, nBits=bits)
        arr = np.zeros((bits,), np.uint8)
        DataStructs.ConvertToNumpyArray(fp, arr)
        rows.append(arr)
    return np.array(rows)


def _good(table: pa.Table) -> tuple[list[int], list[str]]:
    pairs = [(i, s) for i, s in zip(table["id"].to_pylist(), table["smiles"].to_pylist(), strict=True)
             if Chem.MolFromSmiles(s) is not None]  # fmt: skip
    return [i for i, _ in pairs], [s for _, s in pairs]


@pytest.fixture
def library(tmp_path: Path) -> pa.Table:
    table = _library()
    write(table, tmp_path / "library.parquet")
    return table


def _lightgbm(path: Path, smiles: list[str], bits: int) -> Path:
    import lightgbm as lgb

    x = _morgan(smiles, bits).astype(np.float64)
    y = np.array([s.count("O") + 0.5 * s.count("N") for s in smiles])
    joblib.dump(lgb.LGBMRegressor(n_estimators=30, min_child_samples=3, verbose=-1).fit(x, y), path)
    return path


def test_morgan_features_feed_lightgbm_and_a_bad_smiles_is_an_error_row(tmp_path, library):
    ids, smiles = _good(library)
    model = _lightgbm(tmp_path / "scorer.joblib", smiles, 512)
    cfg = job_config(tmp_path / "out", [tmp_path / "library.parquet"], **{"model.name": str(model),
                     "model.featurize": "morgan", "model.morgan_bits": 512, "source.shard_rows": 60})  # fmt: skip
    result = run_job(cfg)
    out = read_output(tmp_path / "out").sort_by("id")
    assert out["id"].to_pylist() == ids and result.report["rows_failed"] == len(BAD)
    expected = joblib.load(model).predict(_morgan(smiles, 512).astype(np.float64))
    np.testing.assert_allclose(out["prediction"].to_numpy(), expected, rtol=1e-9)
    errors = [
        json.loads(line) for p in (tmp_path / "out" / "_errors").glob("part-*") for line in p.read_text().splitlines()
    ]
    assert sorted((e["row"], e["id"]) for e in errors) == [(row, 500 + row) for row in sorted(BAD)]
    by_row = {e["row"]: e for e in errors}
    assert by_row[19]["message"] == "SMILES 'not a molecule' cannot be parsed by RDKit"
    assert {e["stage"] for e in errors} == {"preprocess"}


def test_descriptors_by_name_feed_a_scikit_learn_model(tmp_path, library):
    from sklearn.linear_model import LinearRegression

    ids, smiles = _good(library)
    names = ["MolWt", "TPSA", "NumHDonors"]
    x = np.array([[getattr(Descriptors, n)(Chem.MolFromSmiles(s)) for n in names] for s in smiles])
    model = LinearRegression().fit(x, x @ np.array([0.01, -0.02, 0.5]) + 1.0)
    joblib.dump(model, tmp_path / "lin.joblib")
    base = {"model.name": str(tmp_path / "lin.joblib"), "model.featurize": "descriptors"}
    run_job(job_config(tmp_path / "out", [tmp_path / "library.parquet"], **base, **{"model.feature_columns": names}))
    out = read_output(tmp_path / "out").sort_by("id")
    assert out["id"].to_pylist() == ids
    np.testing.assert_allclose(out["prediction"].to_numpy(), model.predict(x), rtol=1e-9)
    with pytest.raises(
        ConfigError, match=r"^model.feature_columns: 'MolWeight' is not an RDKit descriptor; did you mean MolWt"
    ):
        run_job(job_config(tmp_path / "o2", [tmp_path / "library.parquet"], **base,
                           **{"model.feature_columns": ["MolWeight", "TPSA", "NumHDonors"]}))  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"^model.feature_columns: .*lin.joblib takes 3 features; the featuriser makes 2$"
    ):
        run_job(job_config(tmp_path / "o3", [tmp_path / "library.parquet"], **base,
                           **{"model.feature_columns": ["MolWt", "TPSA"]}))  # fmt: skip


def test_morgan_bits_feed_a_one_matrix_onnx_model(tmp_path, library):
    ids, smiles = _good(library)
    weights = np.random.default_rng(2).normal(size=(64, 1)).astype(np.float32)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])
    score = helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N", 1])
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["score"])], "linear", [x], [score],
                              [numpy_helper.from_array(weights, "W")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "lin.onnx")
    base = {"model.name": str(tmp_path / "lin.onnx"), "model.featurize": "morgan"}
    run_job(job_config(tmp_path / "out", [tmp_path / "library.parquet"], **base, **{"model.morgan_bits": 64}))
    out = read_output(tmp_path / "out").sort_by("id")
    assert out["id"].to_pylist() == ids
    np.testing.assert_allclose(out["score"].to_numpy(), (_morgan(smiles, 64) @ weights)[:, 0], rtol=1e-5)
    with pytest.raises(
        ConfigError, match=r"^model.morgan_bits: .*lin.onnx takes 64 features; the featuriser makes 2048$"
    ):
        run_job(job_config(tmp_path / "o2", [tmp_path / "library.parquet"], **base))


def test_the_docs_screen_keeps_the_best_k_molecules(tmp_path, library):
    ids, smiles = _good(library)
    _lightgbm(tmp_path / "scorer.joblib", smiles, 1024)
    job = re.search(r"<!-- screen-example -->\n```toml\n(.*?)```", SCIENCE.read_text(), re.S).group(1)
    (tmp_path / "screen.toml").write_text(job + '\n[execution]\nprogress = "none"\n')
    proc = subprocess.run([*BULKINFER, "run", "screen.toml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    scores = joblib.load(tmp_path / "scorer.joblib").predict(_morgan(smiles, 1024).astype(np.float64))
    full = sorted(zip(scores.tolist(), ids, strict=True), key=lambda r: (-r[0], r[1]))[:20]
    best = read_output(tmp_path / "hits").sort_by("top_k_rank")
    assert best["id"].to_pylist() == [i for _, i in full]
    assert all(
        math.isclose(a, b, rel_tol=1e-9)
        for a, b in zip(best["prediction"].to_pylist(), [s for s, _ in full], strict=True)
    )
    assert json.loads((tmp_path / "hits" / "_SUCCESS").read_text())["rows_failed"] == len(BAD)


@pytest.mark.parametrize("kind", ["morgan", "descriptors"])
def test_the_featurisers_processes_answer_as_one_process_does_bad_rows_named_where_they_are(kind):
    from bulkinfer.adapters.molecules import POOL_CHUNK, MoleculeError, featurizer
    from bulkinfer.adapters.protocol import RowsRejected

    n = 2 * POOL_CHUNK + 300  # three tasks, the last one short
    smiles = _library(n)["smiles"].to_pylist()
    smiles[POOL_CHUNK + 5] = "C1CC"  # a bad one in the second task: named by its row in the whole call
    names = ["MolWt", "TPSA", "NumHDonors"] if kind == "descriptors" else []
    here = featurizer(kind, 2, 1024, names)
    pooled = featurizer(kind, 2, 1024, names)
    pooled.use_processes(2)
    try:
        want, want_bad = here.matrix(smiles)
        with pytest.raises(RowsRejected) as rejected:
            pooled(smiles)
        got, got_bad = pooled._in_processes(smiles)
    finally:
        pooled.close()
    assert pooled._pool is None  # closed: its processes are gone
    assert sorted(rejected.value.errors) == sorted(want_bad) == [*BAD, POOL_CHUNK + 5]
    assert all(isinstance(e, MoleculeError) for e in rejected.value.errors.values())
    assert got_bad == want_bad and got.shape == want.shape == (n, len(here.names))
    assert np.array_equal(got, want)
