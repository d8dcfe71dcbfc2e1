"""`make demo-recommend` (examples/recommend/demo.py) on a small scale: items embedded,
indexed, every user's candidates computed with history excluded, then served."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_recommendation_demo_runs_end_to_end(tmp_path, redis_server):
    """With REDIS_URL set, as when a Redis is running: the snapshot is published there too and served from it."""
    work = tmp_path / "rec"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "recommend" / "demo.py"), "--items", "120", "--users", "30",
         "--workdir", str(work)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "REDIS_URL": redis_server.url},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    recall = float(re.search(r"recall@10 ([0-9.]+)", out).group(1))
    assert recall >= 0.9
    cands = pads.dataset(work / "candidates", format="parquet").to_table()
    users = pads.dataset(work / "users.parquet", format="parquet").to_table()
    assert cands.num_rows == 30 and sorted(cands["user_id"].to_pylist()) == sorted(users["user_id"].to_pylist())
    history = dict(zip(users["user_id"].to_pylist(), users["history"].to_pylist(), strict=True))
    for row in cands.to_pylist():
        assert len(row["neighbors"]) == 50 and not set(row["neighbors"]) & set(history[row["user_id"]])
    assert f"published to {redis_server.url}" in out and f"serve.results='{redis_server.url}'" in out
    version = redis_server.client().get("cand:current").decode()
    stored = json.loads(redis_server.client().get(f"cand:{version}:{cands['user_id'][0].as_py()}"))
    assert stored["neighbors"] == cands["neighbors"][0].as_py()
    lookup = re.search(r"\$ curl -s http://\S+/v1/results/(\S+)\n(.*)", out)
    assert re.search(r'"answered_by":\s*"precomputed"', lookup.group(2)) and lookup.group(1) in lookup.group(2)
    search = json.loads(out.split("/v1/search", 1)[1].split("\n", 1)[1].splitlines()[0])
    assert len(search["results"][0]["ids"]) == 5


@pytest.mark.parametrize("n_items", [1, 2, 5, 13])
def test_the_demos_users_fit_any_catalog_size(n_items, monkeypatch):
    """--items 5 --users 2 once failed drawing histories of 3..12 items from 5 ('Sample larger
    than population'): a history is at most the catalog, at least one item."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "recommend"))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    from demo import make_users

    users = make_users(40, n_items)
    histories = users["history"].to_pylist()
    assert len(histories) == 40 and all(1 <= len(h) <= min(12, n_items) for h in histories)
    assert all(len(set(h)) == len(h) and set(h) <= set(range(n_items)) for h in histories)


def test_the_demo_refuses_sizes_below_one_in_one_line():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "recommend" / "demo.py"), "--items", "0"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().endswith("--items and --users must be at least 1")
