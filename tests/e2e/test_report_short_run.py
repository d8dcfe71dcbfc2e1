"""The HTML report of a short run reads right: one commit gives a sentence instead of a
one-dot throughput chart; a column that holds one value is said, not charted; unit-norm
vectors' norms are charted at their value, never on an offset axis ("1e-7+1", ticks
-0.5...0.5, which reads as negative norms); and `bulkinfer report` prints no library warning."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from helpers import cli, write

MODEL = """
import numpy as np


def embed(table):
    x = np.asarray(table.column("x").to_pylist(), dtype=np.float32)
    v = np.stack([np.cos(x), np.sin(x)], axis=1)  # unit vectors
    return {"embedding": v, "zeros": np.zeros(len(x), dtype=np.int64), "score": x / 10.0}
"""


def test_the_report_of_a_one_commit_run(tmp_path):
    import os

    (tmp_path / "shortmodel.py").write_text(MODEL)
    write(pa.table({"id": np.arange(50), "x": np.arange(50, dtype=np.float64)}), tmp_path / "in.parquet")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli("run", "-i", "in.parquet", "-m", "shortmodel:embed", "--feature-columns", "x", "--id-column", "id",
        "-o", "out", "--progress", "none", cwd=tmp_path, env=env, check=True)  # fmt: skip
    proc = cli("report", "out", "-o", "r.html", cwd=tmp_path, env=env, check=True)
    assert proc.stderr == ""  # no matplotlib or other library warning
    page = (tmp_path / "r.html").read_text()
    assert "Throughput over time" not in page
    assert "1 commit(s): too few to chart the rate over time; the run's mean is" in page
    assert "Every row holds 0: nothing to chart." in page and "zeros: quantiles" not in page
    assert "score: quantiles" in page  # a column that varies is charted
    norm = page[page.index('aria-label="embedding: vector norm quantiles"') :]
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", norm[: norm.index("</svg>")])
    ticks = [float(t.replace("−", "-")) for t in texts if re.fullmatch(r"[−-]?\d+(\.\d+)?", t)]
    assert ticks and all(0.9 <= t <= 1.1 for t in ticks), texts  # around 1, never an offset axis of -0.5..0.5
    assert not [t for t in texts if "e-" in t or "+1" in t], texts
