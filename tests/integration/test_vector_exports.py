"""Vector databases as export targets: Milvus (Milvus Lite's local file, through pymilvus'
MilvusClient, the client a server is reached with) and LanceDB (embedded), each killed mid-export
and rerun, each holding every id once; their nearest neighbours against ``bulkinfer index``'s."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer.outputs.index import IndexSpec, build_index

from helpers import BULKINFER, cli, crash_then_rerun, read_output, write

pytest.importorskip("pymilvus", reason="the vectors extra (make install adds it)")
pytest.importorskip("lancedb", reason="the vectors extra (make install adds it)")

N, DIM = 400, 16

MODEL = """
import numpy as np


def embed(table):
    ids = np.asarray(table.column("x").to_pylist())
    vectors = np.stack([np.random.default_rng(int(i)).normal(size=16) for i in ids]).astype(np.float32)
    return {"embedding": vectors, "score": ids / 1000.0}
"""


def job_toml(export: dict) -> str:
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in export.items())
    return (
        '[source]\npaths = ["in.parquet"]\nid_column = "id"\nshard_rows = 50\n'
        '[model]\nname = "model:embed"\nfeature_columns = ["x"]\n'
        f'[sink]\npath = "out"\n[[export]]\n{pairs.replace(", ", chr(10))}\n'
    )


@pytest.fixture
def folder(tmp_path, monkeypatch):
    ids = [f"item-{i}" for i in range(N)]
    write(pa.table({"id": ids, "x": np.arange(N)}), tmp_path / "in.parquet")
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def _milvus_rows(path: str) -> tuple[list[str], np.ndarray]:
    from pymilvus import MilvusClient

    client = MilvusClient(path)
    try:
        client.load_collection("items")  # a collection reopened from its file is released until loaded
        rows = client.query("items", filter='id != ""', output_fields=["id", "embedding", "score"], limit=16_384)
    finally:
        client.close()
    return [r["id"] for r in rows], np.array([r["embedding"] for r in rows], np.float32)


def _lance_rows(path: str) -> tuple[list[str], np.ndarray]:
    import lancedb

    t = lancedb.connect(path).open_table("items").to_arrow()
    return t.column("id").to_pylist(), np.stack(t.column("embedding").to_numpy(zero_copy_only=False))


def _same_as_output(folder, ids: list[str], matrix: np.ndarray) -> None:
    out = read_output(folder / "out")
    assert len(ids) == len(set(ids)) == N  # each id once
    by_id = dict(zip(out.column("id").to_pylist(), out.column("embedding").to_pylist(), strict=True))
    stored = dict(zip(ids, matrix, strict=True))
    assert set(stored) == set(by_id)
    assert all(np.allclose(stored[i], by_id[i], atol=1e-6) for i in ("item-0", "item-199", "item-399"))


@pytest.mark.parametrize(
    "kind, point",
    [("milvus", "export-milvus-upserted:3"), ("milvus", "exported:4"), ("lancedb", "export-lancedb-written:3")],
)
def test_every_id_once_after_a_sigkill_mid_export_and_the_rerun(folder, kind, point):
    target = {"kind": "milvus", "uri": str(folder / "items.db"), "collection": "items", "batch_rows": 20}
    if kind == "lancedb":
        target = {"kind": "lancedb", "uri": str(folder / "lance"), "table": "items", "index": "IVF_PQ"}
    (folder / "job.toml").write_text(job_toml(target))
    crash_then_rerun(folder, point)
    ids, matrix = _milvus_rows(str(folder / "items.db")) if kind == "milvus" else _lance_rows(str(folder / "lance"))
    _same_as_output(folder, ids, matrix)
    if kind == "lancedb":
        import lancedb

        indices = lancedb.connect(str(folder / "lance")).open_table("items").list_indices()
        assert [(i.index_type, i.columns) for i in indices] == [("IvfPq", ["embedding"])]


def test_nearest_neighbours_from_each_database_equal_bulkinfer_index(folder):
    targets = [
        {"kind": "milvus", "uri": str(folder / "items.db"), "collection": "items", "index": "HNSW"},
        {"kind": "lancedb", "uri": str(folder / "lance"), "table": "items"},
    ]
    toml = job_toml(targets[0]) + "[[export]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in targets[1].items())
    (folder / "job.toml").write_text(toml + "\n")
    cli("run", "job.toml", "--progress", "none", cwd=folder, check=True)
    build_index(folder / "out", folder / "items.index", IndexSpec(kind="flat", metric="cosine"))
    import faiss
    import lancedb
    import pyarrow.parquet as pq
    from pymilvus import MilvusClient

    index = faiss.read_index(str(folder / "items.index"))
    index_ids = pq.read_table(folder / "items.index.ids.parquet")["id"].to_pylist()
    queries = np.stack([np.random.default_rng(10_000 + q).normal(size=DIM) for q in range(40)]).astype(np.float32)
    _, found = index.search(queries / np.linalg.norm(queries, axis=1, keepdims=True), 10)
    truth = [{index_ids[j] for j in row} for row in found]
    client = MilvusClient(str(folder / "items.db"))
    client.load_collection("items")
    milvus = [{hit["id"] for hit in hits} for hits in client.search("items", data=list(queries), limit=10)]
    client.close()
    lance_table = lancedb.connect(str(folder / "lance")).open_table("items")
    lance = [set(lance_table.search(q).metric("cosine").limit(10).to_arrow()["id"].to_pylist()) for q in queries]
    for name, got in (("milvus", milvus), ("lancedb", lance)):
        overlap = np.mean([len(a & b) / 10 for a, b in zip(truth, got, strict=True)])
        assert overlap >= 0.95, (name, overlap)


def test_a_vector_of_another_dimension_is_refused_before_any_row_is_written(folder):
    made = (  # in a process of its own: Milvus Lite serves a file to one process at a time
        "from pymilvus import MilvusClient; c = MilvusClient('items.db'); c.create_collection('items', dimension=8, "
        "primary_field_name='id', id_type='string', max_length=64, vector_field_name='embedding')"
    )
    subprocess.run([sys.executable, "-c", made], cwd=folder, check=True)
    (folder / "job.toml").write_text(job_toml({"kind": "milvus", "uri": str(folder / "items.db"), "collection": "items"}))
    proc = cli("run", "job.toml", "--progress", "none", cwd=folder)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"bulkinfer: error: export[0] (milvus collection items at {folder / 'items.db'}): the collection has a "
        "vector of 8 dimensions named 'embedding'; the output's has 16; choose another collection or drop it"
    )
    assert (folder / "out" / "_bulkinfer" / "commits.log").read_text() == ""
    lance = {"kind": "lancedb", "uri": str(folder / "lance"), "table": "items"}
    import lancedb

    lancedb.connect(str(folder / "lance")).create_table(
        "items", schema=pa.schema([("id", pa.string()), ("embedding", pa.list_(pa.float32(), 8))])
    )
    (folder / "job.toml").write_text(job_toml(lance))
    proc = cli("run", "job.toml", "--progress", "none", "--overwrite", cwd=folder)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "the table's 'embedding' has 8 dimensions, the output's 16; choose another table" in proc.stderr
    assert lancedb.connect(str(folder / "lance")).open_table("items").count_rows() == 0


def test_an_unreachable_milvus_is_one_line_before_any_inference(folder):
    from services import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    (folder / "job.toml").write_text(job_toml({"kind": "milvus", "uri": uri, "collection": "items"}))
    proc = subprocess.run([*BULKINFER, "run", "job.toml", "--progress", "none"], cwd=folder, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"bulkinfer: error: export[0] (milvus collection items at {uri}): cannot connect ("
    )
    report = json.loads((folder / "out" / "_bulkinfer" / "report.json").read_text())
    assert report["batches"]["count"] == 0
