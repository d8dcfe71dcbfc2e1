"""Size limits of the unit-testable parts, each honoured (never exceeded) or refused in one line:
``source.shard_rows``, ``source.read_batch_rows``, ``runtime.dedupe_cache_rows``, ``serve.audit_max_bytes`` and
``serve.max_file_bytes``. docs/reliability.md#every-limit lists every limit and its test."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer.config.source import SourceConfig
from bulkinfer.runners.reuse import DedupeCache
from bulkinfer.serve.audit import AuditLog
from bulkinfer.serve.files import FileStore
from bulkinfer.serve.validation import ApiError
from bulkinfer.sources import head_schema, list_inputs, plan_shards, read_shard

from helpers import write


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_read_batch_rows_bounds_every_batch_a_reader_yields(tmp_path, suffix):
    path = write(pa.table({"id": np.arange(1000), "x": np.arange(1000) * 0.5}), tmp_path / f"in{suffix}")
    files = list_inputs([str(path)], "auto", SourceConfig())
    for f in files:
        head_schema(f)
    sizes = [b.num_rows for s in plan_shards(files, 400) for b in read_shard(s, ["id", "x"], 64)]
    assert max(sizes) == 64 and sum(sizes) == 1000


@pytest.mark.parametrize(("suffix", "group"), [(".parquet", 1000), (".parquet", 70), (".csv", None), (".jsonl", None)])
def test_no_shard_holds_more_than_shard_rows(tmp_path, suffix, group):
    path = write(pa.table({"id": np.arange(1000), "x": np.arange(1000) * 0.5}), tmp_path / f"in{suffix}", group)
    files = list_inputs([str(path)], "auto", SourceConfig())
    for f in files:
        head_schema(f)
    shards = plan_shards(files, 128)
    assert max(s.num_rows for s in shards) <= 128 and sum(s.num_rows for s in shards) == 1000


def test_the_dedupe_cache_holds_at_most_its_rows():
    cache = DedupeCache(3)
    for start in range(0, 10, 2):
        cache.claim(np.arange(start, start + 2, dtype=np.uint64))
    hits = [s is not None for s in cache.lookup(np.arange(10, dtype=np.uint64))]
    assert sum(hits) == 3 and hits[-3:] == [True, True, True]  # the most recent three, the rest let go


def test_the_audit_log_rotates_at_its_size_and_keeps_five_old_files(tmp_path):
    log = AuditLog(str(tmp_path / "audit.log"), 400)
    for i in range(200):
        log.event("alice", "batch.created", f"batch_{i:04d}", total=i)
    files = sorted(tmp_path.glob("audit.log*"))
    assert [f.name for f in files] == ["audit.log", *(f"audit.log.{i}" for i in range(1, 6))]
    assert all(f.stat().st_size <= 400 for f in files)
    assert json.loads(files[0].read_text().splitlines()[-1])["id"] == "batch_0199"  # the newest kept


def test_an_upload_over_max_file_bytes_is_a_413_and_nothing_is_kept(tmp_path):
    store = FileStore(tmp_path)
    with pytest.raises(ApiError) as refused:
        store.upload(io.BytesIO(b"x" * 101), filename="big.jsonl", purpose="batch", owner=None, max_bytes=100)
    assert refused.value.status == 413 and "big.jsonl is over 100 bytes (serve.max_file_bytes)" in str(refused.value)
    assert list((tmp_path / "files").iterdir()) == []
    kept = store.upload(io.BytesIO(b"x" * 100), filename="ok.jsonl", purpose="batch", owner=None, max_bytes=100)
    assert kept.bytes == 100


def test_the_batch_service_reads_any_line_its_upload_took(tmp_path):
    """A request line is at most its file, and the file at most serve.max_file_bytes: the batch's
    job reads lines that long (a 70 MB line once got "raise source.max_record_bytes", a setting a
    batch's client cannot change, and no custom_id)."""
    from bulkinfer import load_config
    from bulkinfer.serve.batch_jobs import job_config

    for limit in (10 << 20, 500 << 20):
        server = load_config(overrides={"model.name": "minilm", "serve.max_file_bytes": limit})
        job = job_config(server, tmp_path / "input.jsonl", tmp_path / "out", 100)
        assert job.source.max_record_bytes >= limit and job.source.format == "openai-batch"
