"""Limits of the parts that need a real model or server, each honoured or refused:
``model.max_seq_length`` (texts cut to that many tokens) and ``export.maxlen`` (a stream trimmed
to about that many entries). docs/reliability.md#every-limit lists every limit and its test."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa

from bulkinfer import run_job

from helpers import fresh_module, job_config, read_output, write

SAME_START = "the quick brown fox jumps over the lazy dog"


def test_max_seq_length_cuts_each_text_to_that_many_tokens(tmp_path):
    texts = [f"{SAME_START} and then ran far away into the woods", f"{SAME_START} while the cat slept on a warm mat"]
    write(pa.table({"id": [0, 1], "text": texts}), tmp_path / "in.parquet")

    def embeddings(out: str, **extra: object) -> np.ndarray:
        run_job(
            job_config(
                tmp_path / out,
                [tmp_path / "in.parquet"],
                **{"model.name": "minilm", "model.text_column": "text", **extra},
            )
        )
        return np.stack(read_output(tmp_path / out).sort_by("id")["embedding"].to_numpy(zero_copy_only=False))

    cut = embeddings("cut", **{"model.max_seq_length": 8})  # [CLS], 6 shared words, [SEP]
    whole = embeddings("whole")
    assert np.allclose(cut[0], cut[1], atol=1e-6)  # past the 8th token the texts are not read
    assert float(whole[0] @ whole[1]) < 0.99  # read whole they differ


def test_a_stream_export_is_trimmed_to_about_maxlen_entries(tmp_path, redis_server, monkeypatch):
    write(pa.table({"id": np.arange(1000), "x": np.arange(1000.0)}), tmp_path / "in.parquet")
    module = fresh_module(tmp_path, monkeypatch, "ident", "def f(t):\n    return {'y': t.column('x')}\n")
    stream = f"limits:{uuid.uuid4().hex[:8]}"
    cfg = job_config(tmp_path / "out", [tmp_path / "in.parquet"], **{
        "source.shard_rows": 250, "model.name": f"{module}:f", "model.feature_columns": ["x"],
        "export": [{"kind": "redis_stream", "url": redis_server.url, "stream": stream, "maxlen": 50}],
    })  # fmt: skip
    run_job(cfg)
    length = redis_server.client().xlen(stream)
    # XADD MAXLEN ~: Redis trims whole nodes (100 entries), so "about": never fewer, at most a node more
    assert 50 <= length <= 50 + 100, length
