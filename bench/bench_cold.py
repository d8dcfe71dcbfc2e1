"""Fixed costs: time to the first committed row, cold (nothing cached) and warm (the model built
and the gate's verdict kept, a new output), for fp32 and int8 on each CPU engine, one run.

Usage: .venv/bin/python bench/bench_cold.py [ROWS] [--only NAME,NAME] [--json PATH]

Generates ROWS (default 3000) catalog rows with ../shared/bench/make_corpus.py. Each variant runs
`bulkinfer run` twice with its own empty cache (`BULKINFER_CACHE`): cold, then warm into a new
output. Prints, per run, the seconds to the first committed row (report.json
`setup_split.first_commit_s`, from the job's start), the command's whole wall time (process start
and imports included), where the set-up went (plan, export, int8 build, load, gate), the rows the
gate computed that were written rather than inferred again, and each int8's ratio to its engine's
fp32 of the same kind (cold to cold, warm to warm). The issue's target (#35): int8 ≤ 1.3x fp32
cold, ≤ 1.1x warm. `--json PATH` also writes those seconds and the CPU line (bench/targets.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "bench"
WORK = ROOT / "bench" / "_work" / "cold"
VARIANTS = {
    "onnxruntime fp32": [],
    "onnxruntime int8": ["--set", "runtime.precision=int8"],
    "openvino fp32": ["--set", "runtime.engine=openvino"],
    "openvino int8": ["--set", "runtime.engine=openvino", "--set", "runtime.precision=int8"],
}


def run(corpus: Path, out: Path, cache: Path, extra: list[str]) -> tuple[dict, float]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BULKINFER_CACHE": str(cache)}
    exe = str(Path(sys.executable).parent / "bulkinfer")
    t0 = time.perf_counter()
    subprocess.run(
        [exe, "run", "-i", str(corpus), "-m", "minilm", "--text-column", "description", "--id-column", "id",
         "-o", str(out), "--progress", "none", "-q", *extra],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    return json.loads((out / "_bulkinfer" / "report.json").read_text()), wall


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from machine import describe

    print(describe())
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3000
    variants = VARIANTS
    if "--only" in sys.argv:
        words = sys.argv[sys.argv.index("--only") + 1].split(",")
        variants = {k: v for k, v in VARIANTS.items() if any(w in k for w in words)}
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = WORK.parent / f"corpus_{rows}.parquet"
    if not corpus.exists():
        subprocess.run([sys.executable, str(SHARED / "make_corpus.py"), str(corpus), str(rows)], check=True)
    first: dict[tuple[str, str], float] = {}
    for name, extra in variants.items():
        cache = WORK / f"cache-{name.replace(' ', '-')}"
        shutil.rmtree(cache, ignore_errors=True)
        for kind in ("cold", "warm"):
            rep, wall = run(corpus, WORK / "out", cache, extra)
            split = rep.get("setup_split", {})
            first[(name, kind)] = split["first_commit_s"]
            fp32 = first.get((name.replace("int8", "fp32"), kind))
            ratio = f"  {split['first_commit_s'] / fp32:.2f}x fp32's" if "int8" in name and fp32 else ""
            parts = {k: v for k, v in split.items() if k != "first_commit_s"}
            print(
                f"{name:18s} {kind}: first row committed at {split['first_commit_s']:6.2f} s{ratio}"
                f" (command {wall:5.1f} s, rows/s with set-up {rep['rows_out'] / rep['wall_s']:.1f},"
                f" after it {(rep['rows_out'] - rep['reuse'].get('rows_from_gate', 0)) / rep['run_s']:.1f});"
                f" set-up {json.dumps(parts)};"
                f" gate rows written {rep['reuse'].get('rows_from_gate', 0)}",
                flush=True,
            )
    if "--json" in sys.argv:
        seconds: dict[str, dict[str, float]] = {}
        for (name, kind), value in first.items():
            seconds.setdefault(name, {})[kind] = value
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(
            json.dumps({"cpu": describe(), "rows": rows, "first_commit_s": seconds}, indent=1)
        )


if __name__ == "__main__":
    main()
