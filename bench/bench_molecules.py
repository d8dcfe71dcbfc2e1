"""A virtual screen, side by side, one run: N generated SMILES (default 1,000,000), Morgan bits
(radius 2, 2048), a LightGBM scorer, the best 10,000 kept.

Usage: .venv/bin/python bench/bench_molecules.py [N] [--small M]

The anchor is what a chemist writes first: pandas reads the library, ``apply`` parses each
SMILES and computes its fingerprint with RDKit's classic calls (``GetMorganFingerprintAsBitVect``,
``ConvertToNumpyArray``), one ``predict`` over the stacked matrix, ``nlargest`` keeps the best K.
bulkinfer runs the same model with ``model.featurize = "morgan"`` and ``sink.top_k`` (sharded,
resumable, exactly once). Both run as child processes; the figures are molecules/s end to end
(read, featurise, predict, keep the best, write; model loading excluded on both sides) and peak
resident memory, at N and at ``--small`` (default N / 10): memory flat means the two peaks
differ by little.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_tabular import run_child, run_job_file

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "molecules"
PARTS = ["C", "CC", "C(C)", "C(O)", "C(N)", "C(F)", "C(Cl)", "C1CCCCC1", "c1ccccc1", "C(=O)O", "N", "O", "C(C)(C)"]
K = 10_000

ANCHOR = r"""
import sys, time
import joblib, numpy as np, pandas as pd
from rdkit import Chem, DataStructs, RDLogger
from rdkit.Chem import rdMolDescriptors
RDLogger.DisableLog("rdApp.*")  # the classic calls warn that they are deprecated, once a molecule
model = joblib.load(sys.argv[2])
t0 = time.perf_counter()
df = pd.read_parquet(sys.argv[1])
def featurize(smiles):
    mol = Chem.MolFromSmiles(smiles)
    arr = np.zeros((2048,), np.uint8)
    if mol is not None:
        DataStructs.ConvertToNumpyArray(rdMolDescriptors.GetMorganFingerprintAsBitVect(mol, 2, nBits=2048), arr)
    return arr
x = np.stack(df["smiles"].apply(featurize).to_numpy()).astype(np.float64)
df["score"] = model.predict(x)
df.nlargest(int(sys.argv[4]), "score").to_parquet(sys.argv[3])
print(f"rows_per_s={len(df) / (time.perf_counter() - t0):.1f}")
"""


def make_data(n: int) -> tuple[Path, Path]:
    import joblib
    import lightgbm as lgb
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from rdkit import Chem, DataStructs, RDLogger
    from rdkit.Chem import rdMolDescriptors

    RDLogger.DisableLog("rdApp.*")
    WORK.mkdir(parents=True, exist_ok=True)
    data, model = WORK / f"library_{n}.parquet", WORK / "scorer.joblib"
    rng = np.random.default_rng(0)
    if not data.exists():
        smiles = ["".join(rng.choice(PARTS, rng.integers(2, 10))) for _ in range(n)]
        pq.write_table(pa.table({"id": np.arange(n), "smiles": smiles}), data, row_group_size=50_000)
    if not model.exists():
        train = ["".join(rng.choice(PARTS, rng.integers(2, 10))) for _ in range(5_000)]
        x = np.zeros((len(train), 2048))
        for i, s in enumerate(train):
            bits = rdMolDescriptors.GetMorganFingerprintAsBitVect(Chem.MolFromSmiles(s), 2)
            DataStructs.ConvertToNumpyArray(bits, x[i])
        y = np.array([s.count("O") + 0.5 * s.count("N") + rng.normal(0, 0.1) for s in train])
        joblib.dump(lgb.LGBMRegressor(n_estimators=100, verbose=-1).fit(x, y), model)
    return data, model


def one_size(n: int, script: Path) -> dict[str, float]:
    # made in a child: the parent stays small (a child's ru_maxrss starts from its parent's, as forked)
    data, model = map(Path, run_child([sys.executable, __file__, "--data", str(n)])[0].split())
    anchor = [sys.executable, str(script), str(data), str(model), str(WORK / "anchor.parquet"), str(K)]
    out, anchor_rss = run_child(anchor)
    dest = WORK / "screen"
    job = (f'[source]\npaths = ["{data}"]\nid_column = "id"\nshard_rows = 50000\n'
           f'[model]\nname = "{model}"\nfeaturize = "morgan"\n'
           f'[sink]\npath = "{dest}"\ntop_k = {{ by = "prediction", k = {K} }}\n')  # fmt: skip
    report, rss, wall = run_job_file(WORK / "screen.toml", job, dest)
    return {"anchor": float(out.split("rows_per_s=")[1]), "anchor_mib": anchor_rss, "ours": n / report["run_s"],
            "ours_mib": rss, "wall": wall}  # fmt: skip


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    if "--data" in sys.argv:  # a child's work (see one_size)
        print(*make_data(int(sys.argv[sys.argv.index("--data") + 1])))
        return
    print(describe())
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1_000_000
    small = int(sys.argv[sys.argv.index("--small") + 1]) if "--small" in sys.argv else n // 10
    script = WORK / "anchor_molecules.py"
    WORK.mkdir(parents=True, exist_ok=True)
    script.write_text(ANCHOR)
    sizes = {size: one_size(size, script) for size in (small, n)}
    for size, f in sizes.items():
        print(f"{size:>9} molecules: pandas + RDKit apply {f['anchor']:.0f}/s, peak {f['anchor_mib']:.0f} MiB; "
              f"bulkinfer {f['ours']:.0f}/s (wall {f['wall']:.0f} s), peak {f['ours_mib']:.0f} MiB; "
              f"ratio {f['ours'] / f['anchor']:.2f}x")  # fmt: skip
    a, b = sizes[small], sizes[n]
    print(f"peak memory {small} -> {n}: bulkinfer {a['ours_mib']:.0f} -> {b['ours_mib']:.0f} MiB "
          f"({b['ours_mib'] / a['ours_mib']:.2f}x); pandas + RDKit {a['anchor_mib']:.0f} -> {b['anchor_mib']:.0f} MiB "
          f"({b['anchor_mib'] / a['anchor_mib']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
