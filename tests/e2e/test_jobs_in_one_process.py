"""Two jobs at once in one process, as the batch service runs them: each reads its inputs with
its own ``source.storage_options`` (two S3 servers, one bucket name) and withholds, or quotes,
the values its model fails on by its own ``execution.redact``. Neither sees the other's."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq

from bulkinfer import run_job

from helpers import job_config, read_output

MODEL = """
import threading

both_running = threading.Barrier(2, timeout=60)
_seen = set()


def score(table):
    texts = table["text"].to_pylist()
    job = texts[0].split("-")[0]
    if job not in _seen:  # each job's first call waits for the other's: the two run together
        _seen.add(job)
        both_running.wait()
    out = []
    for v in texts:
        if "boom" in v:
            raise ValueError(f"cannot score {v!r}")
        out.append(float(len(v)))
    return {"score": out}
"""


def _upload(server, name: str, n: int) -> None:
    texts = [f"{name}-{i}" for i in range(n)]
    texts[7] = f"{name}-boom CANARY-{name}"
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(n)), "text": texts}), buf)
    server.client().put_object(Bucket="data", Key="in.parquet", Body=buf.getvalue().to_pybytes())


def test_two_jobs_in_one_process_each_see_their_own_storage_options_and_redaction(tmp_path, s3_server, monkeypatch):
    from services import S3Server

    from helpers import fresh_module

    module = fresh_module(tmp_path, monkeypatch, "twojobs", MODEL)
    other = S3Server()
    try:
        for server in (s3_server, other):
            server.bucket("data")
        _upload(s3_server, "a", 60)
        _upload(other, "b", 45)
        jobs = {
            "a": job_config(tmp_path / "out-a", ["s3://data/in.parquet"], **{
                "model.name": f"{module}:score", "model.text_column": "text", "source.shard_rows": 20, "sink.keep_columns": ["text"],
                "source.storage_options": s3_server.options, "execution.redact": True}),
            "b": job_config(tmp_path / "out-b", ["s3://data/in.parquet"], **{
                "model.name": f"{module}:score", "model.text_column": "text", "source.shard_rows": 20, "sink.keep_columns": ["text"],
                "source.storage_options": other.options, "execution.redact": False}),
        }  # fmt: skip
        results: dict[str, object] = {}

        def run(name: str) -> None:
            try:
                results[name] = run_job(jobs[name])
            except BaseException as exc:  # handed to the test's thread
                results[name] = exc

        threads = [threading.Thread(target=run, args=(n,)) for n in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        other.kill()
    for name, n in (("a", 60), ("b", 45)):
        result = results[name]
        assert not isinstance(result, BaseException), f"job {name}: {result!r}"
        out = read_output(tmp_path / f"out-{name}").sort_by("id")
        # each job read its own server's file: its rows, none of the other's (a shard with the bad
        # row fails that row alone; the model call is retried row by row)
        assert out["id"].to_pylist() == [i for i in range(n) if i != 7]
        assert {t.split("-")[0] for t in out["text"].to_pylist()} == {name}
        assert out["score"].to_pylist() == [float(len(t)) for t in out["text"].to_pylist()]
    errors = {n: "".join(p.read_text() for p in (tmp_path / f"out-{n}" / "_errors").glob("*.jsonl")) for n in jobs}
    assert "CANARY" not in errors["a"] and errors["a"].count("withheld: execution.redact") == 1
    assert "CANARY-b" in errors["b"] and "withheld" not in errors["b"]
