"""Side by side, one run, same data: the sentence-transformers script vs `bulkinfer run`.

Usage: .venv/bin/python bench/bench_run.py [ROWS] [--repeat N] [--quick] [--only NAME,NAME] [--json PATH]

Generates ROWS (default 5000) catalog rows with ../shared/bench/make_corpus.py, runs
`bulkinfer tune` on it once, then, in each round, runs the anchors (the sentence-transformers
script ../shared/bench/anchor_st.py, batch 32, and the Ray Data guide pattern
../shared/bench/anchor_ray.py) and `bulkinfer run` in each engine/precision, on the Ray
backend (one worker of 2 CPUs), with the tuned job and with `runtime.precision = "auto"`
(which takes tune's measurements; Parquet in, Parquet out), plus the
bare-engine limit (bench/limit_engine.py: pre-tokenized, length-sorted batches, no I/O) of
the default engine. It prints every rows/s, the ratios to the anchors of the same round,
and the median over rounds. Figures exclude model loading: the anchors' `job_s` starts
after the model is loaded (Ray Data's includes its actor start), bulkinfer's `run_s` after
set-up (the ONNX export is cached by a warm-up run first). `--quick` runs only the
sentence-transformers anchor and the default configuration; `--only default,ray` runs both
anchors and the variants whose names contain one of the words. `--json PATH` also writes
the medians, the CPU line and whether each variant passed its gate (read by bench/targets.py).
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
FLOOR = "runtime.quality_floor=0.995"  # above what full int8 reaches on an AVX2 machine: the search runs
OUTLIERS = 'runtime.int8_fp32_groups=["outlier-channels"]'  # the search's first step, by hand
VARIANTS = {
    "torch fp32": ["--set", "runtime.engine=torch"],
    "default (onnxruntime fp32)": [],
    "openvino fp32": ["--set", "runtime.engine=openvino"],
    "openvino int8 (gated)": ["--set", "runtime.engine=openvino", "--set", "runtime.precision=int8"],
    "onnxruntime int8 (gated)": ["--set", "runtime.precision=int8"],
    "onnxruntime int8, outlier channels in fp32": ["--set", "runtime.precision=int8", "--set", OUTLIERS],
    "onnxruntime int8, floor 0.995 (partial int8)": ["--set", "runtime.precision=int8", "--set", FLOOR],
    "torch bf16 (gated)": ["--set", "runtime.precision=bf16"],
    "ray backend (1 worker x 2 CPUs)": ["--backend", "ray", "--workers", "1", "--set", "execution.num_cpus=2"],
    "after bulkinfer tune": [str(WORK / "tuned.toml")],
    "precision auto (tune's measurements)": ["--set", "runtime.precision=auto"],
}
LOCAL = "default (onnxruntime fp32)"


def sh(*args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BULKINFER_CACHE": str(WORK / "cache")}
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout


def anchor(corpus: Path, script: str = "anchor_st.py", out: str = "anchor.parquet") -> float:
    shutil.rmtree(WORK / out, ignore_errors=True)
    text = sh(sys.executable, str(SHARED / script), str(corpus), str(WORK / out), "32")
    match = re.search(r"rows_per_s=([\d.]+)", text)
    assert match, text
    return float(match.group(1))


def tune(corpus: Path) -> None:
    exe = str(Path(sys.executable).parent / "bulkinfer")
    args = ["-i", str(corpus), "-m", "minilm", "--text-column", "description", "-o", str(WORK / "tuned.toml")]
    sh(exe, "tune", *args)


def bulkinfer(corpus: Path, extra: list[str]) -> dict:
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
        *extra,
    )
    return json.loads((out / "_bulkinfer" / "report.json").read_text())


def steady(rep: dict) -> float:
    """Rows/s after set-up, over the rows the run itself produced: the rows the quality gate
    computed during set-up (written, not inferred again) are left out, so a gated precision is
    not credited with rows it made before the clock started."""
    return (rep["rows_out"] - rep.get("reuse", {}).get("rows_from_gate", 0)) / rep["run_s"]


def limit(corpus: Path) -> float:
    out = sh(sys.executable, str(ROOT / "bench" / "limit_engine.py"), str(corpus))
    return float(re.search(r"rows_per_s=([\d.]+)", out).group(1))  # type: ignore[union-attr]


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    print(describe())  # the CPU and its fast-path flags, beside every figure
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5000
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    variants = {k: v for k, v in VARIANTS.items() if "--quick" not in sys.argv or k == LOCAL}
    if "--only" in sys.argv:
        words = sys.argv[sys.argv.index("--only") + 1].split(",")
        variants = {k: v for k, v in variants.items() if any(w in k for w in words)}
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = WORK / f"corpus_{rows}.parquet"
    if not corpus.exists():
        sh(sys.executable, str(SHARED / "make_corpus.py"), str(corpus), str(rows))
    quick = "--quick" in sys.argv
    if "after bulkinfer tune" in variants or any("auto" in k for k in variants):
        tune(corpus)  # its measurements are what precision = auto runs
    for extra in variants.values():  # warm-up: compile and cache each engine once, untimed
        bulkinfer(corpus, [*extra, "--limit-rows", "64"])
    anchors = ["anchor"] if quick else ["anchor", "ray data pattern"]
    results: dict[str, list[float]] = {k: [] for k in [*anchors, "bare engine limit", *variants]}
    reports: dict[str, dict] = {}
    for i in range(repeat):
        a = anchor(corpus)
        results["anchor"].append(a)
        line = [f"round {i + 1}: sentence-transformers script {a:.1f} rows/s"]
        if not quick:
            results["ray data pattern"].append(anchor(corpus, "anchor_ray.py", "anchor_ray"))
            line.append(f"ray data pattern {results['ray data pattern'][-1]:.1f}")
        for name, extra in variants.items():
            rep = bulkinfer(corpus, extra)
            reports[name] = rep
            results[name].append(steady(rep))
            line.append(f"{name} {results[name][-1]:.1f} ({results[name][-1] / a:.2f}x)")
        results["bare engine limit"].append(limit(corpus))
        line.append(f"bare engine limit {results['bare engine limit'][-1]:.1f}")
        print("; ".join(line), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nmedian over {repeat} round(s), {rows} rows, this machine:")
    for name, value in med.items():
        vs_ray = f", {value / med['ray data pattern']:.2f}x the Ray Data pattern" if not quick else ""
        print(
            f"  {name:32s} {value:8.1f} rows/s   {value / med['anchor']:.2f}x the sentence-transformers script{vs_ray}"
        )
    if LOCAL in med:
        print(f"  default end to end / bare engine limit: {med[LOCAL] / med['bare engine limit']:.2f}")
    ray = "ray backend (1 worker x 2 CPUs)"
    if ray in med and LOCAL in med:
        print(f"  ray backend / local backend: {med[ray] / med[LOCAL]:.2f}")
    if "--json" in sys.argv:
        passed = {name: (rep.get("quality") or {}).get("passed", True) for name, rep in reports.items()}
        figures = {"cpu": describe(), "rows": rows, "rounds": repeat, "rows_per_s": med, "passed": passed}
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(figures, indent=1))
    for name, rep in reports.items():
        q = rep.get("quality")
        gate = f" quality={json.dumps({k: q[k] for k in ('mean_cosine', 'min_cosine', 'top10_overlap')})}" if q else ""
        split = rep.get("setup_split")  # where the set-up went (plan, model, gate) and the first commit
        # rows/s above is over run_s (after set-up); with the set-up counted, the job's own wall
        whole = f" rows/s with set-up={rep['rows_out'] / rep['wall_s']:.1f}" if rep.get("wall_s") else ""
        print(
            f"  {name}: ran {rep['engine']} {rep['precision']}, time share {json.dumps(rep['time_share'])}"
            f" wait_for_input_s={rep['wait_for_input_s']}"
            f" run_s={rep['run_s']} padding_ratio={rep['batches']['padding_ratio']}{gate}"
            f" setup_s={rep['setup_s']}{f' setup_split={json.dumps(split)}' if split else ''}{whole}"
            + (f" backend={json.dumps(rep['backend'])}" if rep.get("backend") else "")  # Ray: start, busy share
        )


if __name__ == "__main__":
    main()
