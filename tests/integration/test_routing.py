"""Routing (the moderation case, with the docs' example routes): rows whose score crosses a threshold go to a human-review
queue (a Redis stream) and a PostgreSQL table, borderline ones to a folder, the rest to the
output; each row in exactly one place, however often the job is killed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from bulkinfer import ConfigError, load_config, run_job

from helpers import BULKINFER, crash_then_rerun, read_output, write

MODEL = """
import numpy as np


def moderate(table):
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float64)
    return {"proba_unsafe": x / 250.0, "label": np.where(x % 2 == 0, "even", "odd")}
"""

OUTPUTS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"
N = 250
REVIEW = {i for i in range(N) if i / 250.0 >= 0.8}  # 200..249
BORDERLINE = {i for i in range(N) if 0.5 <= i / 250.0 < 0.8 and i % 2 == 0}  # even ids in 125..199


@pytest.fixture
def moderation(tmp_path, monkeypatch, redis_server, postgres_server):
    write(pa.table({"id": np.arange(N), "x": np.arange(N)}), tmp_path / "in.parquet")
    (tmp_path / "modmodel.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("modmodel", None)
    tag = uuid.uuid4().hex[:8]
    job = """
[source]
paths = ["in.parquet"]
id_column = "id"
shard_rows = 50

[model]
name = "modmodel:moderate"
feature_columns = ["x"]

[sink]
path = "out"

"""
    routes = re.search(r"<!-- route-example -->\n```toml\n(.*?)```", OUTPUTS_PAGE.read_text(), re.S).group(1)
    routes = (
        routes.replace("redis://127.0.0.1:6379/0", redis_server.url)  # the servers of this test
        .replace("postgresql://postgres@127.0.0.1:5432/postgres", postgres_server.dsn)
        .replace("moderation:review", f"review:{tag}")
        .replace("review_queue", f"review_{tag}")
    )
    job += routes
    (tmp_path / "job.toml").write_text(job)
    return tag


def stream_ids(redis_server, tag: str) -> list[int]:
    entries = redis_server.client().xrange(f"review:{tag}")
    return [int(fields[b"id"]) for _id, fields in entries]


def check_every_row_once(tmp_path, redis_server, postgres_server, tag: str) -> None:
    out = read_output(tmp_path / "out")
    assert sorted(out["id"].to_pylist()) == sorted(set(range(N)) - REVIEW - BORDERLINE)
    assert sorted(stream_ids(redis_server, tag)) == sorted(REVIEW)
    with postgres_server.connect() as c:
        rows = c.execute(f"SELECT id, proba_unsafe FROM review_{tag} ORDER BY id").fetchall()
    assert [r[0] for r in rows] == sorted(REVIEW) and rows[0][1] == pytest.approx(200 / 250)
    border = pads.dataset(tmp_path / "borderline", format="parquet").to_table()
    assert sorted(border["id"].to_pylist()) == sorted(BORDERLINE)
    assert set(border["label"].to_pylist()) == {"even"}


def test_each_row_lands_in_exactly_one_route(tmp_path, moderation, redis_server, postgres_server):
    result = run_job(load_config(tmp_path / "job.toml"))
    check_every_row_once(tmp_path, redis_server, postgres_server, moderation)
    assert len(REVIEW) == 50 and len(BORDERLINE) == 37
    assert result.report["routes"] == {"default": N - 50 - 37, "review": 50, "borderline": 37}
    assert result.report["rows_out"] == N
    assert set(result.report["exports"]) == {
        f"route[review].export[0] (redis stream review:{moderation} at {redis_server.url})",
        f"route[review].export[1] (postgres table review_{moderation})",
        "route[borderline].export[0] (folder borderline)",
    }
    entry = redis_server.client().xrange(f"review:{moderation}", count=1)[0][1]
    assert entry == {b"id": b"200", b"proba_unsafe": b"0.8", b"label": b"even"}
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert manifest["rows"] == N - 87 and manifest["rows_routed"] == 87


@pytest.mark.parametrize("point", ["exported:2", "part-renamed:3"])
def test_a_killed_job_routes_every_row_once_after_the_rerun(tmp_path, moderation, redis_server, postgres_server, point):
    crash_then_rerun(tmp_path, point)
    check_every_row_once(tmp_path, redis_server, postgres_server, moderation)


def test_a_bad_expression_is_refused_at_config_time_naming_the_token(tmp_path):
    route = {"name": "review", "when": "proba_unsafe >= >= 0.8", "export": [{"kind": "folder", "path": "r"}]}
    with pytest.raises(
        ConfigError, match=r"^config: route\.0\.when: expected a value, a column or '\(' at 16, got '>='"
    ):
        load_config(overrides={"route": [route]})
    with pytest.raises(ConfigError, match=r"route\.0\.name: 'default': use letters"):
        load_config(overrides={"route": [{**route, "name": "default", "when": "x > 1"}]})


def test_an_unknown_column_stops_the_job_before_anything_is_committed(tmp_path, moderation):
    text = (tmp_path / "job.toml").read_text().replace("proba_unsafe >= 0.8", "proba_unsafe_typo >= 0.8")
    (tmp_path / "job.toml").write_text(text)
    proc = subprocess.run([*BULKINFER, "run", "job.toml", "--progress", "none"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "bulkinfer: error: route[review].when: no column 'proba_unsafe_typo' (the rows have id, proba_unsafe, label)"
    )
    assert not list((tmp_path / "out").glob("part-*"))
