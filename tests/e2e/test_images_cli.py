"""The contract outside checks use: `bulkinfer run --input 'photos/*.jpg' --model nudenet`
writes one row per picture (id = the path relative to the input's root), each bad picture one
error row naming the file, and a kill -9 anywhere then a rerun give every picture once."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from helpers import BULKINFER, cli, read_output
from pictures import write_bad, write_photos


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("pics")
    good = write_photos(root / "photos", 12, scale=0.5)
    bad = write_bad(root / "photos")
    return root, sorted(good), bad


def _run(root, out, env=None):
    args = ["run", "--input", "photos/*.jpg", "--model", "nudenet", "--output", out, "--set", "source.shard_rows=3"]
    return cli(*args, "--set", "execution.max_errors=5", cwd=root, env=env)


def _reference(photos):
    root = photos[0]
    proc = _run(root, "reference")
    assert proc.returncode == 0, proc.stderr
    return {r["id"]: r["detections"] for r in read_output(root / "reference").to_pylist()}


def test_run_writes_each_picture_and_names_each_bad_file(photos):
    root, good, bad = photos
    rows = _reference(photos)
    assert sorted(rows) == good
    errors = [
        json.loads(line) for f in (root / "reference" / "_errors").iterdir() for line in f.read_text().splitlines()
    ]
    assert {e["id"]: e["message"] for e in errors}.keys() == bad.keys()
    for e in errors:
        assert e["message"].startswith(e["id"] + ": ") and bad[e["id"]] in e["message"]
    assert any(rows[i] for i in rows if "astronaut" in i)


@pytest.mark.parametrize("point", ["part-temp-written:2", "exported:3", "part-renamed:4"])
def test_kill_9_then_rerun_gives_every_picture_once(photos, point):
    root, good, _bad = photos
    out = "killed-" + point.replace(":", "-")
    env = {**os.environ, "BULKINFER_CRASH_AT": point}
    proc = subprocess.run([*BULKINFER, "run", "--input", "photos/*.jpg", "--model", "nudenet", "--output", out,
                           "--set", "source.shard_rows=3", "--set", "execution.max_errors=5"],
                          cwd=root, env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    rerun = _run(root, out)
    assert rerun.returncode == 0, rerun.stderr
    table = read_output(root / out)
    ids = table.column("id").to_pylist()
    assert sorted(ids) == good and len(ids) == len(set(ids))
    reference = _reference(photos)
    assert {r["id"]: r["detections"] for r in table.to_pylist()} == reference
