"""Features from Feast, side by side, one run: E entities (default 100,000 and 1,000,000), 20
features in one feature view (Feast's local provider: a Parquet file offline store), a LightGBM
model, the predictions written to Parquet.

Usage: .venv/bin/python bench/bench_feast.py [E ...] [--shard-rows R]

The anchor is Feast's documented pattern: one ``get_historical_features`` over the whole entity
table, ``to_df()``, ``predict`` on the dataframe, ``to_parquet``. bulkinfer runs the same model
with ``source.kind = "feast"`` (sharded, resumable, exactly once; each shard one Feast call,
``source.shard_rows`` default 100,000 here). Both run as child processes, after ``feast apply``;
the figures are entities/s end to end (model loading and the store's opening excluded on both
sides) and peak resident memory. Each side's predictions are checked against the other's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench_tabular import run_child, run_job_file

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "feast"
FEATURES = [f"f{i}" for i in range(20)]

DEFINITIONS = """
from datetime import timedelta
from feast import Entity, FeatureView, Field, FileSource
from feast.types import Float64
user = Entity(name="user", join_keys=["user_id"])
user_features = FeatureView(
    name="user_features", entities=[user], ttl=timedelta(days=30),
    schema=[Field(name=f"f{i}", dtype=Float64) for i in range(20)],
    source=FileSource(path="data/features.parquet", timestamp_field="event_timestamp"),
)
"""

STORE = """project: bench
registry: data/registry.db
provider: local
online_store:
  type: sqlite
  path: data/online.db
offline_store:
  type: file
entity_key_serialization_version: 3
"""

ANCHOR = r"""
import sys, time
import joblib, pandas as pd
from feast import FeatureStore
repo, model, out = sys.argv[1], joblib.load(sys.argv[2]), sys.argv[3]
refs = [f"user_features:f{i}" for i in range(20)]
store = FeatureStore(repo_path=repo)
t0 = time.perf_counter()
entities = pd.read_parquet(f"{repo}/entities.parquet")
df = store.get_historical_features(entity_df=entities, features=refs).to_df()
df["score"] = model.predict(df[[f"f{i}" for i in range(20)]])
df[["user_id", "event_timestamp", "score"]].to_parquet(out)
print(f"rows_per_s={len(df) / (time.perf_counter() - t0):.1f}")
"""


def make_repo(entities: int) -> Path:
    import datetime as dt

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = WORK / f"repo_{entities}"
    if (repo / "data" / "registry.db").exists():
        return repo
    (repo / "data").mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(STORE)
    (repo / "definitions.py").write_text(DEFINITIONS)
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    users = np.arange(entities)
    values = np.random.default_rng(0).normal(size=(entities, len(FEATURES)))
    stamps = pa.array([t0] * entities, pa.timestamp("us", "UTC"))
    pq.write_table(pa.table({"user_id": users, "event_timestamp": stamps,
                             **{n: values[:, i] for i, n in enumerate(FEATURES)}}),
                   repo / "data" / "features.parquet")  # fmt: skip
    asked = pa.array([t0 + dt.timedelta(days=1)] * entities, pa.timestamp("us", "UTC"))
    pq.write_table(pa.table({"user_id": users, "event_timestamp": asked}), repo / "entities.parquet")
    feast = Path(sys.executable).parent / "feast"
    subprocess.run([str(feast), "apply"], cwd=repo, check=True, capture_output=True)
    return repo


def make_model() -> Path:
    import joblib
    import lightgbm
    import numpy as np

    path = WORK / "model.joblib"
    if not path.exists():
        x = np.random.default_rng(1).normal(size=(20_000, len(FEATURES)))
        y = x[:, 0] - 2 * x[:, 1] + np.sin(x[:, 2])
        joblib.dump(lightgbm.LGBMRegressor(n_estimators=100, verbose=-1).fit(x, y), path)
    return path


def one_size(entities: int, model: Path, script: Path, shard_rows: int) -> dict[str, float]:
    repo = Path(_in_child("--repo", str(entities)).strip())
    anchor_out = WORK / "anchor.parquet"
    out, anchor_rss = run_child([sys.executable, str(script), str(repo), str(model), str(anchor_out)])
    dest = WORK / "bulkinfer_out"
    refs = ", ".join(f'"user_features:{n}"' for n in FEATURES)
    job = (f'[source]\nkind = "feast"\nfeast_repo = "{repo}"\npaths = ["{repo / "entities.parquet"}"]\n'
           f'id_column = "user_id"\nfeatures = [{refs}]\nshard_rows = {shard_rows}\n'
           f'[model]\nname = "{model}"\n[sink]\npath = "{dest}"\n')  # fmt: skip
    report, rss, wall = run_job_file(WORK / "feast.toml", job, dest)
    return {"anchor": float(out.split("rows_per_s=")[1]), "anchor_mib": anchor_rss,
            "ours": entities / report["run_s"], "ours_mib": rss, "wall": wall,
            "diff": float(_in_child("--difference", str(anchor_out), str(dest)))}  # fmt: skip


def _in_child(*args: str) -> str:
    return run_child([sys.executable, __file__, *args])[0]


def _difference(anchor: Path, ours: Path) -> float:
    import numpy as np
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    a = pq.read_table(anchor).sort_by("user_id")
    b = ds.dataset(sorted(str(p) for p in ours.glob("part-*.parquet")), format="parquet").to_table().sort_by("user_id")
    column = next(c for c in b.column_names if c not in ("user_id", "event_timestamp", "_input_hash"))
    assert a.column("user_id").equals(b.column("user_id")), "the two sides predicted other entities"
    return float(np.max(np.abs(a.column("score").to_numpy() - b.column(column).to_numpy())))


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    if "--repo" in sys.argv:  # a child's work (see _in_child)
        print(make_repo(int(sys.argv[sys.argv.index("--repo") + 1])))
        return
    if "--difference" in sys.argv:
        at = sys.argv.index("--difference")
        print(_difference(Path(sys.argv[at + 1]), Path(sys.argv[at + 2])))
        return
    print(describe())
    sizes = [int(a) for a in sys.argv[1:] if a.isdigit() and sys.argv[sys.argv.index(a) - 1] != "--shard-rows"]
    shard_rows = int(sys.argv[sys.argv.index("--shard-rows") + 1]) if "--shard-rows" in sys.argv else 100_000
    WORK.mkdir(parents=True, exist_ok=True)
    script = WORK / "anchor_feast.py"
    script.write_text(ANCHOR)
    model = make_model()
    results = {e: one_size(e, model, script, shard_rows) for e in sizes or [100_000, 1_000_000]}
    for e, f in results.items():
        print(f"{e:>9} entities x 20 features: Feast get_historical_features + predict {f['anchor']:,.0f}/s, "
              f"peak {f['anchor_mib']:.0f} MiB; bulkinfer {f['ours']:,.0f}/s (wall {f['wall']:.0f} s), "
              f"peak {f['ours_mib']:.0f} MiB; ratio {f['ours'] / f['anchor']:.2f}x; "
              f"max abs difference {f['diff']:.2e}")  # fmt: skip
    if len(results) > 1:
        (small, a), (large, b) = min(results.items()), max(results.items())
        print(f"peak memory {small} -> {large}: bulkinfer {a['ours_mib']:.0f} -> {b['ours_mib']:.0f} MiB "
              f"({b['ours_mib'] / a['ours_mib']:.2f}x); "
              f"Feast's pattern {a['anchor_mib']:.0f} -> {b['anchor_mib']:.0f} MiB "
              f"({b['anchor_mib'] / a['anchor_mib']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
