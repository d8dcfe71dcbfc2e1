"""``execution.redact``: a canary value planted in every kind of bad input (a ragged CSV row,
an invalid JSONL line, a value that does not fit its type, a model that quotes the value it
fails on) appears nowhere on disk or in output with redaction, and does appear without it
(so the search would find a leak)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from helpers import cli

CANARY = "CANARY-51d0e2"
MODEL = """
def score(table):
    out = []
    for v in table["text"].to_pylist():
        if "boom" in v:
            raise ValueError(f"cannot score {v!r}")
        out.append(float(len(v)))
    return {"score": out}
"""


def files_holding(root: Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def make_inputs(d: Path) -> None:
    d.mkdir()
    csv_rows = ["id,text,n"] + [f"{i},row {i},{i}" for i in range(30)]
    csv_rows[5] = f"4,{CANARY} ragged,4,extra"  # a row with one field too many
    csv_rows[9] = f"{CANARY},fine,8"  # the id is not a number
    (d / "a.csv").write_text("\n".join(csv_rows) + "\n")
    lines = [f'{{"id": {100 + i}, "text": "line {i}", "n": {i}}}' for i in range(30)]
    lines[3] = f'{{"id": 103, "text": "{CANARY} broken'  # not JSON
    lines[7] = f'{{"id": 107, "text": "boom {CANARY}", "n": 7}}'  # the model quotes it when it fails
    (d / "b.jsonl").write_text("\n".join(lines) + "\n")


def run(d: Path, out: str, redact: bool) -> subprocess.CompletedProcess:
    args = ["run", "-i", "in/a.csv", "-i", "in/b.jsonl", "-m", "redactmodel:score", "--text-column", "text",
            "--id-column", "id", "-o", out, "--progress", "none", "--set", "source.column_types={id = 'int64'}",
            "--set", f"execution.redact={'true' if redact else 'false'}"]  # fmt: skip
    return cli(*args, cwd=d, env={**os.environ, "PYTHONPATH": str(d)})


def test_no_input_value_reaches_disk_or_logs_with_redact(tmp_path):
    (tmp_path / "redactmodel.py").write_text(MODEL)
    make_inputs(tmp_path / "in")
    plain = run(tmp_path, "plain", redact=False)
    assert plain.returncode == 0, plain.stderr
    leaks = files_holding(tmp_path / "plain", CANARY)
    assert leaks and any("_errors" in p for p in leaks)  # without redaction the values are quoted

    hidden = run(tmp_path, "hidden", redact=True)
    assert hidden.returncode == 0, hidden.stderr
    assert CANARY not in hidden.stdout + hidden.stderr
    assert files_holding(tmp_path / "hidden", CANARY) == []
    errors = "".join(p.read_text() for p in (tmp_path / "hidden" / "_errors").glob("*.jsonl"))
    assert errors.count("withheld: execution.redact") == 4  # the four bad rows, each still recorded
    assert '"id": 107' in errors and '"row": 8' in errors  # the id and the row number stay
    # the HTML report: the plain run's page quotes the value (so the search below would find a leak)
    assert cli("report", "plain", "-o", "plain.html", cwd=tmp_path).returncode == 0
    assert CANARY in (tmp_path / "plain.html").read_text()
    report = cli("report", "hidden", "-o", "page.html", cwd=tmp_path)
    assert report.returncode == 0 and CANARY not in (tmp_path / "page.html").read_text()


def test_serve_withholds_the_value_a_model_fails_on(tmp_path):
    (tmp_path / "redactmodel.py").write_text(MODEL)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "bulkinfer", "serve", "--port", "0", "-m", "redactmodel:score", "--text-column",
           "text", "--set", "execution.redact=true"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        url = next(m.group(1) for line in proc.stderr if (m := re.search(r"at (http://127\.0\.0\.1:\d+)", line)))
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/predict", json={"rows": [{"text": f"boom {CANARY}"}]})
        assert r.status_code == 422 and CANARY not in r.text and "withheld" in r.text
        assert httpx.post(f"{url}/v1/predict", json={"rows": [{"text": "fine"}]}).json()["rows"] == [{"score": 4.0}]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


SECRET = "SECRET-8f3a6c"


def test_credentials_in_the_config_reach_no_file_and_a_retry_asks_for_them(tmp_path, s3_server, postgres_server):
    """An S3 sink's key and secret and a PostgreSQL password in the export's DSN are used
    (the job writes through both) but written nowhere: not in the bucket (job.json, the
    report, the manifest) nor in the local folder nor the run's output. --retry-errors
    on an output whose job.json had a password refuses with the field to give again."""
    import pyarrow.parquet as pq

    (tmp_path / "redactmodel.py").write_text(MODEL)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(f'{{"id": {i}, "text": "row {i}"}}\n' for i in range(20)))
    bucket = s3_server.bucket("creds")
    options = {**s3_server.options, "key": f"AKIA{SECRET}", "secret": SECRET}  # moto takes any credentials
    user, rest = postgres_server.dsn.split("@", 1)
    dsn = f"{user}:{SECRET}@{rest}"  # trust authentication: the password is sent, never checked
    table = f"creds_{os.getpid()}"
    export = f'[{{kind = "postgres", dsn = "{dsn}", table = "{table}", mode = "append", vector = "array"}}]'
    opts = "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in options.items()) + "}"
    common = ["-i", "in/a.jsonl", "-m", "redactmodel:score", "--text-column", "text", "--id-column", "id",
              "--progress", "none", "--set", f"export={export}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = cli("run", *common, "-o", f"s3://{bucket}/out", "--set", f"sink.storage_options={opts}", cwd=tmp_path,
               env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys = s3_server.keys(bucket)
    assert "out/_SUCCESS" in keys and "out/_bulkinfer/job.json" in keys
    assert [k for k in keys if SECRET in s3_server.get(bucket, k).decode("utf-8", "replace")] == []
    assert files_holding(tmp_path, SECRET) == [] and SECRET not in done.stdout + done.stderr
    job = s3_server.get(bucket, "out/_bulkinfer/job.json").decode()
    assert "<redacted>" in job and s3_server.endpoint in job  # masked, while what is not secret stays
    with postgres_server.connect() as c:
        assert c.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 20

    local = cli("run", *common, "-o", "out", cwd=tmp_path, env=env)  # a local output, the same export
    assert local.returncode == 0, local.stderr
    assert files_holding(tmp_path, SECRET) == []
    assert pq.read_table(tmp_path / "out" / "part-00000.parquet").num_rows == 20
    retry = cli("run", "--retry-errors", "out", cwd=tmp_path, env=env)
    assert retry.returncode == 1
    assert retry.stderr.strip().splitlines()[-1] == (
        "bulkinfer: error: export[0].dsn: the output's job.json keeps no credentials; rerun with the job file "
        "that holds it (-c)"
    )


def _toml(v: object) -> str:
    import json

    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)
