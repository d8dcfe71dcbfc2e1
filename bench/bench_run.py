"""Side by side, one run, same data: the sentence-transformers script vs `bulkinfer run`.

Usage: .venv/bin/python bench/bench_run.py [ROWS] [--repeat N]

Generates ROWS (default 5000) catalog rows with ../shared/bench/make_corpus.py, then runs,
alternating, the anchor script (../shared/bench/anchor_st.py, batch 32) and `bulkinfer run`
(fp32, default settings), Parquet in and Parquet out, and prints each rows/s, the ratio,
and bulkinfer's time split. Both figures exclude model loading: the anchor's `job_s` starts
after the model is loaded, bulkinfer's `run_s` after set-up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "bench"
WORK = ROOT / "bench" / "_work"


def sh(*args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout


def anchor(corpus: Path) -> float:
    out = sh(sys.executable, str(SHARED / "anchor_st.py"), str(corpus), str(WORK / "anchor.parquet"), "32")
    match = re.search(r"rows_per_s=([\d.]+)", out)
    assert match, out
    return float(match.group(1))


def bulkinfer(corpus: Path) -> dict:
    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    sh(
        str(Path(sys.executable).parent / "bulkinfer"),
        "run",
        "-i",
        str(corpus),
        "-m",
        "minilm",
        "--text-column",
        "description",
        "--id-column",
        "id",
        "-o",
        str(out),
        "--progress",
        "none",
        "-q",
    )
    return json.loads((out / "_bulkinfer" / "report.json").read_text())


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5000
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = WORK / f"corpus_{rows}.parquet"
    if not corpus.exists():
        sh(sys.executable, str(SHARED / "make_corpus.py"), str(corpus), str(rows))
    a_runs, b_runs, reports = [], [], []
    for i in range(repeat):
        a_runs.append(anchor(corpus))
        rep = bulkinfer(corpus)
        reports.append(rep)
        b_runs.append(rep["rows_per_s"])
        print(
            f"round {i + 1}: sentence-transformers script {a_runs[-1]:.1f} rows/s, "
            f"bulkinfer {b_runs[-1]:.1f} rows/s, ratio {b_runs[-1] / a_runs[-1]:.2f}x",
            flush=True,
        )
    a, b = statistics.median(a_runs), statistics.median(b_runs)
    rep = reports[-1]
    print(f"\nrows={rows} anchor_st_rows_per_s={a:.1f} bulkinfer_rows_per_s={b:.1f} ratio={b / a:.2f}x")
    print(
        "bulkinfer time share (of run_s):",
        json.dumps(rep["time_share"]),
        f"wait_for_input_s={rep['wait_for_input_s']} run_s={rep['run_s']} setup_s={rep['setup_s']}",
    )
    print("bulkinfer batches:", json.dumps(rep["batches"]))


if __name__ == "__main__":
    main()
