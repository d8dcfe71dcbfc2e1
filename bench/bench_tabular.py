"""Tabular, side by side, one run: a LightGBM model over ROWS generated rows (default 1M).

Usage: .venv/bin/python bench/bench_tabular.py [ROWS] [--repeat N]

The anchor is what a user writes first: load the whole Parquet file into memory,
``model.predict`` and ``predict_proba`` on all of it, write one Parquet file. bulkinfer runs
the same model with `bulkinfer run` (Parquet in, Parquet out, sharded, exactly-once). Both
run as child processes; the figures are rows/s end to end (read, predict, write; model
loading excluded on both sides) and peak resident memory (``ru_maxrss`` of the child),
both in total and above the baseline every process that loads the model pays (importing
LightGBM and unpickling the model alone costs about 190 MiB).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work"

ANCHOR = r"""
import sys, time
import joblib, numpy as np, pyarrow as pa, pyarrow.parquet as pq
model = joblib.load(sys.argv[2])
t0 = time.perf_counter()
df = pq.read_table(sys.argv[1]).to_pandas()
x = df[["x1", "x2", "x3", "x4", "x5", "x6"]]
pred = model.predict(x)
proba = model.predict_proba(x)
out = pa.table({"id": df["id"].to_numpy(), "prediction": pred, "proba_0": proba[:, 0], "proba_1": proba[:, 1]})
pq.write_table(out, sys.argv[3])
print(f"rows_per_s={len(df) / (time.perf_counter() - t0):.1f}")
"""


def make_data(rows: int) -> tuple[Path, Path]:
    import joblib
    import lightgbm as lgb
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, model = WORK / f"tabular_{rows}.parquet", WORK / "lgbm.joblib"
    rng = np.random.default_rng(0)
    if not data.exists():
        cols = {f"x{i}": rng.normal(size=rows) for i in range(1, 7)}
        table = pa.table({"id": np.arange(rows), **cols, "segment": [f"s{i % 7}" for i in range(rows)]})
        pq.write_table(table, data, row_group_size=100_000)
    if not model.exists():
        x = pd.DataFrame({f"x{i}": rng.normal(size=20_000) for i in range(1, 7)})
        y = (x["x1"] + 0.5 * x["x2"] - x["x3"] * x["x4"] > 0).astype(int)
        joblib.dump(lgb.LGBMClassifier(n_estimators=100, verbose=-1).fit(x, y), model)
    return data, model


def run_child(args: list[str]) -> tuple[str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    if status != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed: {err}")
    return out, usage.ru_maxrss / 1024


def run_job_file(job: Path, text: str, dest: Path) -> tuple[dict, float, float]:
    """``bulkinfer run`` of the job ``text`` (written to ``job``) into a fresh ``dest``: its
    report.json, its peak resident MiB and its wall seconds."""
    shutil.rmtree(dest, ignore_errors=True)
    job.write_text(text + '[execution]\nprogress = "none"\n')
    t0 = time.perf_counter()
    _, rss = run_child([str(Path(sys.executable).parent / "bulkinfer"), "run", str(job), "-q"])
    wall = time.perf_counter() - t0
    return json.loads((dest / "_bulkinfer" / "report.json").read_text()), rss, wall


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    print(describe())  # the CPU and its fast-path flags, beside every figure
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1_000_000
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    WORK.mkdir(parents=True, exist_ok=True)
    data, model = make_data(rows)
    script = WORK / "anchor_tabular.py"
    script.write_text(ANCHOR)
    exe = str(Path(sys.executable).parent / "bulkinfer")
    keys = ("anchor rows/s", "anchor MiB", "bulkinfer rows/s", "bulkinfer MiB")
    figures: dict[str, list[float]] = {k: [] for k in keys}
    _, baseline = run_child([sys.executable, "-c", f"import joblib, pyarrow.parquet; joblib.load({str(model)!r})"])
    for i in range(repeat):
        out, rss = run_child([sys.executable, str(script), str(data), str(model), str(WORK / "anchor_out.parquet")])
        figures["anchor rows/s"].append(float(out.split("rows_per_s=")[1]))
        figures["anchor MiB"].append(rss)
        dest = WORK / "tabular_out"
        shutil.rmtree(dest, ignore_errors=True)
        t0 = time.perf_counter()
        args = [
            exe,
            "run",
            "-i",
            str(data),
            "-m",
            str(model),
            "--id-column",
            "id",
            "-o",
            str(dest),
            "--progress",
            "none",
        ]
        _, rss = run_child([*args, "-q"])
        report = json.loads((dest / "_bulkinfer" / "report.json").read_text())
        figures["bulkinfer rows/s"].append(report["rows_per_s"])
        figures["bulkinfer MiB"].append(rss)
        print(
            f"round {i + 1}: model.predict on the whole table {figures['anchor rows/s'][-1]:.0f} rows/s, "
            f"peak {figures['anchor MiB'][-1]:.0f} MiB; bulkinfer {report['rows_per_s']:.0f} rows/s "
            f"(wall {time.perf_counter() - t0:.1f} s), peak {rss:.0f} MiB; time share {report['time_share']}",
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\nmedian over {repeat} round(s), {rows} rows, LightGBM 100 trees, this machine:")
    print(f"  rows/s: bulkinfer / one-shot predict = {med['bulkinfer rows/s'] / med['anchor rows/s']:.2f}")
    b, a = med["bulkinfer MiB"], med["anchor MiB"]
    print(f"  peak memory: bulkinfer {b:.0f} MiB / one-shot predict {a:.0f} MiB = {b / a:.2f}")
    print(
        f"  peak memory above the {baseline:.0f} MiB of loading the model: "
        f"bulkinfer {b - baseline:.0f} / one-shot {a - baseline:.0f} MiB = {(b - baseline) / (a - baseline):.2f}"
    )


if __name__ == "__main__":
    main()
