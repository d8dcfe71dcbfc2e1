"""Vector database exports against a bare bulk insert with each library's own client, same
vectors, one run: N rows (default 200,000) of D float32 values (default 384) and a string id.

Usage: .venv/bin/python bench/bench_vectors.py [N] [--dim D]

bulkinfer runs a job whose model hands the input's vectors through and exports them to Milvus
(Milvus Lite's local file) and to LanceDB; its figure is the seconds report.json gives each
export (the time spent in the target's writes, upserts by id). The anchors, in child processes:
``MilvusClient.insert`` in calls of 1,000 rows into a fresh collection (FLAT index, as the
export's is set here), and LanceDB's ``create_table`` from the whole Arrow table. Ratio:
anchor seconds / bulkinfer seconds (the issue asks ≥ 0.8).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from bench_tabular import run_child, run_job_file

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "vectors"

MODEL = """
def passthrough(table):
    return {"embedding": table.column("vector")}
"""

ANCHOR = r"""
import sys, time
import lancedb, numpy as np, pyarrow.parquet as pq
from pymilvus import MilvusClient
data, kind, where = pq.read_table(sys.argv[1]), sys.argv[2], sys.argv[3]
ids, vectors = data.column("id").to_pylist(), data.column("vector").combine_chunks()
dim = vectors.type.list_size
client = MilvusClient(where) if kind == "milvus" else lancedb.connect(where)  # connected before the clock, as ours is
t0 = time.perf_counter()
if kind == "milvus":
    client.create_collection("items", dimension=dim, primary_field_name="id", id_type="string", max_length=64,
                             vector_field_name="embedding", index_type="FLAT")
    matrix = vectors.flatten().to_numpy().reshape(len(ids), dim)
    for at in range(0, len(ids), 1000):
        client.insert("items", [{"id": i, "embedding": v} for i, v in zip(ids[at:at + 1000], matrix[at:at + 1000])])
    client.flush("items")
else:
    client.create_table("items", data=data.rename_columns(["id", "embedding"]))
print(f"seconds={time.perf_counter() - t0:.3f}")
"""


def make_data(n: int, dim: int) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = WORK / f"vectors_{n}x{dim}.parquet"
    if not path.exists():
        flat = np.random.default_rng(0).normal(size=n * dim).astype(np.float32)
        table = pa.table({"id": [f"item-{i}" for i in range(n)],
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array(flat), dim)})  # fmt: skip
        pq.write_table(table, path)
    return path


def ours(data: Path) -> dict[str, float]:
    """Each export's seconds, as the job's report.json gives them."""
    dest = WORK / "out"
    for old in ("items.db", "lance"):
        shutil.rmtree(WORK / old, ignore_errors=True)
        (WORK / old).unlink(missing_ok=True) if (WORK / old).is_file() else None
    job = (f'[source]\npaths = ["{data}"]\nid_column = "id"\nshard_rows = 20000\n'
           '[model]\nname = "vectors_model:passthrough"\nfeature_columns = ["vector"]\n'
           f'[sink]\npath = "{dest}"\n'
           f'[[export]]\nkind = "milvus"\nuri = "{WORK / "items.db"}"\ncollection = "items"\nindex = "FLAT"\n'
           f'[[export]]\nkind = "lancedb"\nuri = "{WORK / "lance"}"\ntable = "items"\n')  # fmt: skip
    report, _rss, _wall = run_job_file(WORK / "vectors.toml", job, dest)
    return {name.split(" (")[1].split()[0]: f["seconds"] for name, f in report["exports"].items()}


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    print(describe())
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 200_000
    dim = int(sys.argv[sys.argv.index("--dim") + 1]) if "--dim" in sys.argv else 384
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "vectors_model.py").write_text(MODEL)
    sys.path.insert(0, str(WORK))
    data = make_data(n, dim)
    script = WORK / "anchor_vectors.py"
    script.write_text(ANCHOR)
    import os

    os.environ["PYTHONPATH"] = f"{WORK}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    t0 = time.perf_counter()
    mine = ours(data)
    anchors = {}
    for kind, where in (("milvus", WORK / "anchor.db"), ("lancedb", WORK / "anchor_lance")):
        shutil.rmtree(where, ignore_errors=True)
        where.unlink(missing_ok=True) if where.is_file() else None
        out, _rss = run_child([sys.executable, str(script), str(data), kind, str(where)])
        anchors[kind] = float(out.split("seconds=")[1])
    for kind in ("milvus", "lancedb"):
        print(f"{n} vectors of {dim}: {kind} bare bulk insert {anchors[kind]:.1f} s ({n / anchors[kind]:,.0f} rows/s); "
              f"bulkinfer's export {mine[kind]:.1f} s ({n / mine[kind]:,.0f} rows/s); "
              f"ratio {anchors[kind] / mine[kind]:.2f}x")  # fmt: skip
    print(f"(bench wall {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
