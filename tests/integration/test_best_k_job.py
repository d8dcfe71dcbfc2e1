"""``sink.top_k`` through ``bulkinfer run`` with the docs' example: the output holds the job's
best K rows, ranked, equal to a full sort of every row's score, after a SIGKILL anywhere (while
shards commit, while the finish cuts the parts, before ``_SUCCESS``) and a rerun; bad settings
are one line before any row."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from helpers import BULKINFER, crash_then_rerun, read_output, write

SCIENCE = Path(__file__).resolve().parents[2] / "docs" / "science.md"
N = 1000
SCORER = """
import numpy as np


def score(table):
    x = np.asarray(table.column("x").to_numpy(zero_copy_only=False), dtype=np.float64)
    return {"score": x, "label": np.where(x > 0.5, "keep", "drop")}
"""


def _library() -> pa.Table:
    """Scores with ties (rounded) and NaNs, ids shuffled against the input order."""
    rng = np.random.default_rng(7)
    x = np.round(rng.random(N), 2)
    x[rng.choice(N, 40, replace=False)] = np.nan
    return pa.table({"id": rng.permutation(N) + 10_000, "x": x})


def _full_sort(table: pa.Table, k: int) -> list[int]:
    rows = [(s, i) for s, i in zip(table["x"].to_pylist(), table["id"].to_pylist(), strict=True)]
    return [i for s, i in sorted(rows, key=lambda r: (math.isnan(r[0]), -r[0] if not math.isnan(r[0]) else 0, r[1]))][:k]


@pytest.fixture
def screening(tmp_path: Path, monkeypatch) -> Path:
    write(_library(), tmp_path / "library.parquet")
    (tmp_path / "scorer.py").write_text(SCORER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    job = re.search(r"<!-- top-k-example -->\n```toml\n(.*?)```", SCIENCE.read_text(), re.S).group(1)
    (tmp_path / "job.toml").write_text(job + '\n[execution]\nprogress = "none"\n')
    return tmp_path


def _run(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BULKINFER, "run", "job.toml", *extra], cwd=cwd, capture_output=True, text=True)


def _check_best(cwd: Path) -> None:
    out = read_output(cwd / "best").sort_by("top_k_rank")
    assert out["id"].to_pylist() == _full_sort(_library(), 50)
    assert out["top_k_rank"].to_pylist() == list(range(1, 51))
    assert set(out.column_names) == {"id", "score", "label", "top_k_rank", "_input_hash"}
    success = json.loads((cwd / "best" / "_SUCCESS").read_text())
    assert success["rows"] == 50 and sum(f["rows"] for f in success["files"]) == 50
    assert success["top_k"] == {"by": "score", "k": 50, "order": "desc", "candidates": 10 * 50}
    sizes = {f["name"]: f["bytes"] for f in success["files"]}
    assert sizes == {p.name: p.stat().st_size for p in (cwd / "best").glob("part-*")}


def test_the_docs_example_keeps_the_best_k_of_a_full_sort(screening):
    proc = _run(screening)
    assert proc.returncode == 0, proc.stderr
    _check_best(screening)


@pytest.mark.parametrize("point", ["part-renamed:4", "top-k-part-cut:3", "success-temp-written"])
def test_a_killed_screen_ends_equal_to_a_full_sort(screening, point):
    crash_then_rerun(screening, point)
    _check_best(screening)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ('id_column = "id"\n', "sink.top_k: needs source.id_column"),
        ('by = "score"', "sink.top_k.by: the model's output has no column 'scores'"),
        ('by = "score"', "sink.top_k.by: 'label' holds string, not numbers"),
    ],
)
def test_a_setting_top_k_cannot_honour_is_one_line_before_any_row(screening, change, says):
    job = (screening / "job.toml").read_text()
    replacement = "" if change.startswith("id_column") else ('by = "scores"' if "scores" in says else 'by = "label"')
    (screening / "job.toml").write_text(job.replace(change, replacement))
    proc = _run(screening)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"bulkinfer: error: {says}"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((screening / "best").glob("part-*"))


def test_top_k_is_part_of_the_job(screening):
    assert _run(screening).returncode == 0
    job = (screening / "job.toml").read_text().replace("k = 50", "k = 20")
    (screening / "job.toml").write_text(job)
    proc = _run(screening)
    assert proc.returncode == 1 and "sink.top_k" in proc.stderr, proc.stderr
