"""Index build and top-k as a job, against plain Faiss scripts on the same vectors, one run.

Usage: .venv/bin/python bench/bench_index.py [ITEMS] [QUERIES] [--dim D]

- Items: ITEMS clustered float32 vectors (default 50,000 x 384), written as a finished
  bulkinfer output (a pass-through model, so no model is timed).
- Build: a plain script (read every part into memory, normalise, ``IndexHNSWFlat`` /
  ``IndexIVFPQ`` with the same parameters, ``add``, ``write_index``) against ``bulkinfer
  index`` (streamed, plus the recall check, the ids and the provenance). Both indexes are checked for recall@10 against
  exact search on the same 200 queries, and timed on them (queries/s).
- Top-k: QUERIES query vectors near the items (default 20,000), k = 50 from the HNSW
  index: a plain "load the index, loop over batches of 1,024, ``index.search``, write
  Parquet" script against ``bulkinfer run -m items.index``, each run as its own process;
  rows/s and recall@10 against exact.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

from machine import describe  # noqa: E402

MODEL = "def passthrough(table):\n    return {'embedding': table['v']}\n"

PLAIN_TOPK = """
import faiss, numpy as np, pyarrow as pa, pyarrow.parquet as pq

index = faiss.read_index("hnsw.index")
ids = pq.read_table("hnsw.index.ids.parquet")["id"].to_numpy()
writer = None
for batch in pq.ParquetFile("queries.parquet").iter_batches(batch_size=1024):
    col = batch.column("v")
    q = col.flatten().to_numpy().reshape(len(col), -1)
    q = np.ascontiguousarray(q / np.linalg.norm(q, axis=1, keepdims=True), dtype=np.float32)
    scores, labels = index.search(q, 50)
    out = pa.table({"id": batch.column("id"), "neighbors": pa.array(list(ids[labels])),
                    "scores": pa.array(list(scores))})
    writer = writer or pq.ParquetWriter("plain-topk.parquet", out.schema)
    writer.write_table(out)
writer.close()
"""


def clustered(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(16, n // 200), d))
    return (centers[rng.integers(0, len(centers), n)] + 0.6 * rng.normal(size=(n, d))).astype(np.float32)


def as_table(ids: np.ndarray, v: np.ndarray) -> pa.Table:
    return pa.table({"id": ids, "v": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), v.shape[1])})


def unit(m: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(m / np.linalg.norm(m, axis=1, keepdims=True), dtype=np.float32)


def recall(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


def bulkinfer(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "bulkinfer", *args], cwd=cwd, check=True, capture_output=True)


def plain_build(out: Path, kind: str, params: dict[str, int], dest: Path) -> tuple[object, float]:
    import faiss

    t0 = time.perf_counter()
    table = pads.dataset(out, format="parquet", exclude_invalid_files=True).to_table(columns=["embedding"])
    col = table.column("embedding").combine_chunks()
    m = unit(col.flatten().to_numpy().reshape(len(col), -1))
    d = m.shape[1]
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
        index.hnsw.efSearch = params["ef_search"]
    else:
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, params["nlist"], params["pq_m"], params["nbits"],
                                 faiss.METRIC_INNER_PRODUCT)  # fmt: skip
        sample = m[
            np.random.default_rng(0).choice(len(m), min(len(m), max(256 * 64, 40 * params["nlist"])), replace=False)
        ]
        index.train(sample)
        index.nprobe = params["nprobe"]
    index.add(m)
    faiss.write_index(index, str(dest))  # a script keeps its index too
    return index, time.perf_counter() - t0


def main() -> None:
    import faiss

    from bulkinfer.outputs.index import IndexSpec, build_index

    p = argparse.ArgumentParser()
    p.add_argument("items", nargs="?", type=int, default=50_000)
    p.add_argument("queries", nargs="?", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--kinds", default="hnsw,ivf-pq", help="index kinds to build (hnsw is needed for the top-k)")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-index-"))
    try:
        items = clustered(a.items, a.dim, 0)
        pq.write_table(as_table(np.arange(a.items), items), work / "items.parquet", row_group_size=10_000)
        (work / "passthrough.py").write_text(MODEL)
        bulkinfer("run", "-i", "items.parquet", "-m", "passthrough:passthrough", "--feature-columns", "v",
                  "--id-column", "id", "-o", "items", "--shard-rows", "10000", "--progress", "none",
                  cwd=work)  # fmt: skip
        probe = unit(items[np.random.default_rng(9).choice(a.items, 200, replace=False)])
        exact = faiss.IndexFlatIP(a.dim)
        exact.add(unit(items))
        _, truth = exact.search(probe, 10)
        print(f"{describe()}; {a.items} items x {a.dim} dims, faiss {faiss.__version__}")
        print(f"{'build':28s} {'plain s':>8s} {'bulkinfer s':>12s} {'ratio':>6s} {'recall plain/ours':>18s} "
              f"{'q/s plain/ours':>16s}")  # fmt: skip
        for kind in a.kinds.split(","):
            t0 = time.perf_counter()
            report = build_index(work / "items", work / f"{kind}.index", IndexSpec(kind=kind))  # type: ignore[arg-type]
            ours_s = time.perf_counter() - t0
            plain, plain_s = plain_build(work / "items", kind, report.params, work / f"plain-{kind}.index")
            ours = faiss.read_index(str(work / f"{kind}.index"))
            ids = pq.read_table(work / f"{kind}.index.ids.parquet")["id"].to_numpy()
            rates, recalls = [], []
            for index, mapping in ((plain, None), (ours, ids)):
                t1 = time.perf_counter()
                _, found = index.search(probe, 10)
                rates.append(len(probe) / (time.perf_counter() - t1))
                recalls.append(recall(found if mapping is None else mapping[found], truth))
            print(f"{kind + ' ' + str(report.params):28.28s} {plain_s:8.2f} {ours_s:12.2f} {ours_s / plain_s:6.2f} "
                  f"{recalls[0]:8.3f}/{recalls[1]:.3f} {rates[0]:8.0f}/{rates[1]:.0f}")  # fmt: skip

        # top-k as a job, k = 50, from the HNSW index
        rng = np.random.default_rng(1)  # users near the items: a catalog's own neighbourhoods
        queries = (items[rng.integers(0, a.items, a.queries)] + 0.3 * rng.normal(size=(a.queries, a.dim))).astype(
            np.float32
        )
        pq.write_table(as_table(np.arange(a.queries), queries), work / "queries.parquet", row_group_size=10_000)

        (work / "plain_topk.py").write_text(PLAIN_TOPK)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "plain_topk.py"], cwd=work, check=True)
        plain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        bulkinfer("run", "-i", "queries.parquet", "-m", "hnsw.index", "--feature-columns", "v", "--id-column", "id",
                  "-o", "topk", "--k", "50", "--set", "model.options={exclude_self = false}", "--progress", "none",
                  cwd=work)  # fmt: skip
        ours_s = time.perf_counter() - t0
        got = pads.dataset(work / "topk", format="parquet", exclude_invalid_files=True).to_table().sort_by("id")
        sample = np.random.default_rng(3).choice(a.queries, 200, replace=False)
        _, qtruth = exact.search(unit(queries[sample]), 10)
        found = np.array([got["neighbors"][int(i)].as_py()[:10] for i in sample])
        print(f"top-50 job, {a.queries} queries: plain script {a.queries / plain_s:,.0f} rows/s | bulkinfer "
              f"{a.queries / ours_s:,.0f} rows/s (each a process: start, index load, read, search, write) | "
              f"{plain_s / ours_s:.2f}x; recall@10 {recall(found, qtruth):.3f}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
