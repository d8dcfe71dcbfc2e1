from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer import load_config, run_job

from helpers import make_catalog, read_output, write


@pytest.fixture(scope="module")
def texts() -> list[str]:
    catalog = make_catalog(260, seed=3)["description"].to_pylist()
    # empty, blank (spaces; tabs and line breaks), padded, non-ASCII, mixed case, over the
    # 256-token window in words and in one unbroken run of characters
    odd = ["", "   ", "\t\n \n", "   padded   ", "Ünïcödé façade — naïve café 東京 🚀", "UPPER lower MiXeD",
           "word " * 600, "x" * 20000]  # fmt: skip
    return odd + catalog


def test_embeddings_match_sentence_transformers(tmp_path, texts, minilm_path):
    from sentence_transformers import SentenceTransformer

    write(pa.table({"id": list(range(len(texts))), "text": texts}), tmp_path / "in.parquet", row_group_size=50)
    cfg = load_config(
        overrides={
            "source.paths": [str(tmp_path / "in.parquet")],
            "model.name": "minilm",
            "model.text_column": "text",
            "source.id_column": "id",
            "sink.path": str(tmp_path / "out"),
            "source.shard_rows": 100,
            "runtime.batch_size": 8,
            "execution.progress": "none",
        }
    )
    result = run_job(cfg)
    assert result.status == "complete"
    out = read_output(tmp_path / "out")
    assert out.column_names == ["id", "embedding", "_input_hash"]
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert out["id"].to_pylist() == list(range(len(texts)))  # input order, though batches were sorted
    got = np.stack(out["embedding"].to_numpy(zero_copy_only=False))
    ref = SentenceTransformer(str(minilm_path), device="cpu").encode(texts, batch_size=32)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.9999, (cos.argmin(), cos.min())
    assert result.report["batches"]["padding_ratio"] < 1.2
    assert max(int(k.split("-")[-1]) for k in result.report["batches"]["histogram"]) <= 8
