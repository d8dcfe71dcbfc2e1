"""``bulkinfer.spark.predict`` in a user's own PySpark script, run with the virtual
environment's Python without activating it (``.venv/bin/python script.py``): PySpark would
start its workers with the system's ``python3`` (no pyarrow, no bulkinfer) and fail deep in
Py4J; on a local master the workers run the script's interpreter instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads

from helpers import make_catalog, write

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def test_the_docs_example_runs_as_a_script_with_the_venvs_python_not_activated(tmp_path):
    code = re.search(r"<!-- spark-example -->\n```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    write(make_catalog(30, seed=5), tmp_path / "catalog.parquet")
    (tmp_path / "score.py").write_text(code.replace("getOrCreate()", 'master("local[1]").getOrCreate()'))
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, "score.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = pads.dataset(tmp_path / "embeddings", format="parquet").to_table().sort_by("id")
    assert got["id"].to_pylist() == list(range(30)) and got["_error"].null_count == 30
