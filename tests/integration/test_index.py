"""`bulkinfer index` over a finished output: Faiss flat / HNSW / IVF-PQ, recall against exact
search, provenance, bad rows kept out of the index, and the gate that refuses a poor index."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkinfer import load_config, run_job
from bulkinfer.core.errors import QualityGateError, SourceError
from bulkinfer.outputs.index import IndexSpec, build_index

from helpers import cli

MODEL = """
def embed(table):
    return {"embedding": table["v"]}
"""
N, D = 3000, 32


def vectors(n: int = N, d: int = D, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(40, d))
    return (centers[rng.integers(0, 40, n)] + 0.5 * rng.normal(size=(n, d))).astype(np.float32)


@pytest.fixture
def items(tmp_path, monkeypatch):
    """A finished output of N vectors with string ids (the model passes the input's vectors through)."""
    (tmp_path / "vecmodel.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("vecmodel", None)

    def make(rows: list | None = None, name: str = "out") -> tuple:
        v = vectors()
        values = rows if rows is not None else [list(x) for x in v]
        ids = [f"item-{i}" for i in range(len(values))]
        table = pa.table({"id": ids, "v": pa.array(values, pa.list_(pa.float32()))})
        pq.write_table(table, tmp_path / f"{name}.parquet")
        cfg = load_config(overrides={"source.paths": [f"{name}.parquet"], "source.id_column": "id",
                                     "source.shard_rows": 1000, "model.name": "vecmodel:embed",
                                     "model.feature_columns": ["v"], "sink.path": name,
                                     "execution.progress": "none"})  # fmt: skip
        result = run_job(cfg)
        return tmp_path / name, ids, v, result

    return make


def exact_top(v: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    unit = v / np.linalg.norm(v, axis=1, keepdims=True)
    qs = q / np.linalg.norm(q, axis=1, keepdims=True)
    return np.argsort(-(qs @ unit.T), axis=1)[:, :k]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf-pq"])
def test_an_index_finds_the_exact_neighbours_and_says_where_it_came_from(items, tmp_path, kind):
    import faiss

    out, ids, v, result = items()
    report = build_index(out, tmp_path / "items.index", IndexSpec(kind=kind))
    assert (report.vectors, report.rows_failed, report.dim, report.queries) == (N, 0, D, 200)
    floor = {"flat": 1.0, "hnsw": 0.95, "ivf-pq": 0.5}[kind]
    assert report.recall >= floor
    index = faiss.read_index(str(tmp_path / "items.index"))
    stored = pq.read_table(tmp_path / "items.index.ids.parquet")["id"].to_pylist()
    assert sorted(stored) == sorted(ids)
    # an independent check of the recorded recall: 50 queries against numpy's exact answer
    q = v[::60]
    _, found = index.search(q / np.linalg.norm(q, axis=1, keepdims=True), 10)
    truth = exact_top(v, q, 10)
    got = [{stored[j] for j in row} for row in found]
    want = [{ids[j] for j in row} for row in truth]
    recall = np.mean([len(g & w) / 10 for g, w in zip(got, want, strict=True)])
    assert recall >= floor - 0.05
    meta = json.loads((tmp_path / "items.index.json").read_text())
    job = json.loads((out / "_bulkinfer" / "job.json").read_text())
    assert meta["job_fingerprint"] == job["fingerprint"] == result.report["job_fingerprint"]
    assert meta["model"]["digest"] == job["model_digest"] and meta["model"]["name"] == "vecmodel:embed"
    assert (meta["column"], meta["id_column"], meta["report"]["metric"]) == ("embedding", "id", "cosine")


def test_bad_vectors_are_error_rows_not_index_entries(items, tmp_path):
    rows = [list(x) for x in vectors(200)]
    rows[3] = None
    rows[50] = rows[50][:10]  # another dimension
    rows[120] = [float("nan")] * D
    out, ids, _v, _r = items(rows)
    report = build_index(out, tmp_path / "items.index", IndexSpec(kind="flat", queries=20))
    assert (report.vectors, report.rows_failed) == (197, 3)
    errors = [json.loads(x) for x in (tmp_path / "items.index.errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["error"]) for e in errors] == [
        (3, "the vector is null"),
        (50, f"the vector has 10 dimensions, the others {D}"),
        (120, "the vector holds NaN, infinity or null"),
    ]
    stored = pq.read_table(tmp_path / "items.index.ids.parquet")["id"].to_pylist()
    assert set(ids) - set(stored) == {"item-3", "item-50", "item-120"}


def test_the_recall_gate_refuses_a_poor_index_and_writes_nothing(items, tmp_path):
    out, *_ = items()
    with pytest.raises(QualityGateError, match=r"recall@10 is 0\.\d+, under --min-recall 0\.99 \(ivf-pq"):
        build_index(out, tmp_path / "items.index", IndexSpec(kind="ivf-pq", pq_m=4, nprobe=1), min_recall=0.99)
    assert not list(tmp_path.glob("items.index*"))


def test_the_cli_builds_and_explains_what_it_cannot_index(items, tmp_path):
    out, *_ = items()
    proc = cli("index", "out", "-o", "items.index", "--kind", "hnsw", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["vectors"] == N
    missing = cli("index", "out", "-o", "x.index", "--column", "vector", cwd=tmp_path)
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "bulkinfer: error: out/part-00000.parquet: no column 'vector' (it has id, embedding); pass --column"
        )
    )
    unfinished = cli("index", "nowhere", "-o", "x.index", cwd=tmp_path)
    assert unfinished.returncode == 1
    assert "nowhere: no finished run here (no _SUCCESS)" in unfinished.stderr
    with pytest.raises(SourceError, match="only Parquet output can be indexed"):
        (out / "_SUCCESS").write_text(json.dumps({"files": [{"name": "part-00000.csv", "rows": 1}]}))
        build_index(out, tmp_path / "y.index", IndexSpec())


# -- kNN as a model ------------------------------------------------------------------------
def test_knn_job_writes_the_exact_top_k_without_the_row_itself_or_what_it_has_seen(items, tmp_path):
    out, ids, v, _ = items()
    build_index(out, tmp_path / "items.index", IndexSpec(kind="flat"))
    rng = np.random.default_rng(3)
    q = np.arange(0, N, 7)  # the items themselves as queries: their own id must not come back
    seen = [[ids[j] for j in rng.integers(0, N, 4)] for _ in q]
    per_row_k = [int(x) for x in rng.integers(1, 9, len(q))]
    queries = pa.table({"id": [ids[i] for i in q], "vec": pa.array([list(v[i]) for i in q], pa.list_(pa.float32())),
                        "seen": seen, "want": per_row_k})  # fmt: skip
    pq.write_table(queries, tmp_path / "queries.parquet")
    proc = cli("run", "-i", "queries.parquet", "-m", "items.index", "--feature-columns", "vec", "--id-column", "id",
               "-o", "knn", "--k", "8", "--set", "model.options={exclude_column = 'seen', k_column = 'want'}",
               "--progress", "none", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # --k and the --set of the same table merge: the job holds all three options
    stored = json.loads((tmp_path / "knn" / "_bulkinfer" / "job.json").read_text())["config"]["model"]["options"]
    assert stored == {"k": 8, "exclude_column": "seen", "k_column": "want"}
    import pyarrow.dataset as pads

    table = pads.dataset(tmp_path / "knn", format="parquet").to_table().sort_by("id")
    rows = {r["id"]: r for r in table.to_pylist()}
    truth = exact_top(v, v[q], 20)
    for n, i in enumerate(q):
        drop = {ids[i], *seen[n]}
        want = [ids[j] for j in truth[n] if ids[j] not in drop][: per_row_k[n]]
        r = rows[ids[i]]
        assert r["neighbors"] == want, (ids[i], r["neighbors"], want)
        assert len(r["scores"]) == len(want) and r["scores"] == sorted(r["scores"], reverse=True)


def test_knn_refuses_queries_it_cannot_answer_with_one_line(items, tmp_path):
    out, *_ = items()
    build_index(out, tmp_path / "items.index", IndexSpec(kind="flat", queries=20))
    small = pa.table({"id": ["q"], "vec": pa.array([[0.5] * 16], pa.list_(pa.float32()))})
    pq.write_table(small, tmp_path / "q16.parquet")
    base = ["run", "-i", "q16.parquet", "--feature-columns", "vec", "--id-column", "id", "--progress", "none"]
    proc = cli(*base, "-m", "items.index", "-o", "k1", "--set", "execution.max_error_rate=0", cwd=tmp_path)
    assert proc.returncode == 1
    assert "vec: query vectors of 16 dimensions; " in proc.stderr
    assert "items.index holds 32-dimensional ones" in proc.stderr
    proc = cli(*base, "-m", "items.index", "-o", "k2", "--set", "model.options={metric = 'l2'}", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"bulkinfer: error: model.options.metric: {tmp_path / 'items.index'} was built for cosine similarity, "
        "not l2; build another index with --metric"
    )
    proc = cli(*base, "-m", "nothere.index", "-o", "k3", cwd=tmp_path)
    assert proc.returncode == 1 and "model 'nothere.index': no such file or directory" in proc.stderr
    (tmp_path / "lonely.index").write_bytes((tmp_path / "items.index").read_bytes())
    proc = cli(*base, "-m", "lonely.index", "--set", "model.kind='knn'", "-o", "k4", cwd=tmp_path)
    assert proc.returncode == 1 and "not an index written by bulkinfer index (no lonely.index.json" in proc.stderr


def test_an_index_section_builds_the_index_when_the_job_completes(items, tmp_path):
    (tmp_path / "job.toml").write_text(
        '[source]\npaths = ["out.parquet"]\nid_column = "id"\n[model]\nname = "vecmodel:embed"\n'
        'feature_columns = ["v"]\n[sink]\npath = "out"\n[index]\noutput = "items.index"\nkind = "hnsw"\n'
    )
    items()  # writes out.parquet (and an output there, which this job file replaces)
    proc = cli("run", "job.toml", "--overwrite", "--progress", "none", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"index: items.index \(hnsw, {N} vectors\), recall@10 (0\.9[5-9]\d*|1\.0+)", proc.stdout)
    assert json.loads((tmp_path / "items.index.json").read_text())["report"]["vectors"] == N
    gated = cli("run", "job.toml", "--set", "index.kind='ivf-pq'", "--set", "index.min_recall=0.999",
                "--progress", "none", cwd=tmp_path)  # fmt: skip
    assert gated.returncode == 1 and "under --min-recall 0.999 (ivf-pq" in gated.stderr
    assert (tmp_path / "out" / "_SUCCESS").is_file()  # the job's output stays complete


def test_a_text_query_is_refused_when_the_index_model_changed_since(items, tmp_path):
    """The index records the digest of the model its vectors came from; queries embedded by a
    model whose files changed would not match them."""
    from bulkinfer.adapters.knn import KnnAdapter
    from bulkinfer.core.errors import ModelError

    out, *_ = items()
    build_index(out, tmp_path / "items.index", IndexSpec(kind="flat", queries=10))
    model_dir = tmp_path / "textmodel"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"version 1")
    meta_path = tmp_path / "items.index.json"
    meta = json.loads(meta_path.read_text())
    meta["model"] = {"kind": "text-embedding", "location": str(model_dir), "digest": "digest-of-version-0"}
    meta_path.write_text(json.dumps(meta))
    cfg = load_config(overrides={"model.name": str(tmp_path / "items.index"), "model.text_column": "profile"})
    with pytest.raises(ModelError, match=r"built from embeddings of .*textmodel \(digest digest-of-version-0\), "
                                         r"which is gone or changed since"):  # fmt: skip
        KnnAdapter(tmp_path / "items.index", cfg)


def test_serve_swaps_in_a_newer_finished_run(items, tmp_path):
    """serve.results over a folder: a later run that finishes there is indexed aside, then swapped in."""
    import os
    import time

    from bulkinfer.serve.results import ResultIndex

    out, ids, *_ = items()
    index = ResultIndex(out, "id")
    assert index.newer() is None and index.get("item-3")["embedding"] is not None
    os.utime(out / "_SUCCESS", (time.time() + 5, time.time() + 5))  # as a later run's _SUCCESS would be
    newer = index.newer()
    assert newer is not None and len(newer) == len(ids) and newer.newer() is None


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_an_output_smaller_than_k_is_indexed_with_full_recall(items, tmp_path, kind):
    """Five vectors and k = 10: every query's true neighbours are the five there are, and an
    exact index finds them all (recall 1.0, not 5/10 that would fail any --min-recall)."""
    v = vectors()[:5]
    out, *_ = items([list(x) for x in v], name="small")
    report = build_index(out, tmp_path / f"small-{kind}.index", IndexSpec(kind=kind, k=10, queries=5), 0.99)
    assert report.vectors == 5 and report.recall == 1.0


def test_ivf_pq_on_a_small_output_says_it_once_instead_of_faiss_printing_a_line_per_k_means(items, tmp_path):
    """Faiss prints 'WARNING clustering ... please provide at least ... training points' for every
    k-means it runs short of points (one per sub-quantizer: hundreds of lines); bulkinfer says it
    in one line and the parameters read as name=value, not a Python dict."""
    items([list(x) for x in vectors()[:200]], name="small")  # 200 vectors: under what 16 PQ codes want
    proc = cli("index", "small", "-o", "items.index", "--kind", "ivf-pq", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING clustering" not in proc.stderr and "{" not in proc.stdout
    (line,) = [x for x in proc.stderr.splitlines() if "ivf-pq trains on" in x]
    assert line.startswith("bulkinfer: ivf-pq trains on 200 vectors, under the ~") and "measured recall" in line
    assert re.search(r"ivf-pq \(cosine, \d+ dims, nlist=\d+, pq_m=\d+, nbits=\d+, nprobe=\d+\)", proc.stdout)
