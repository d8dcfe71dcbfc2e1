"""The int8 gate on AVX2-only kernels, on a machine that has more: the job runs under qemu's
user-mode emulation of an AVX2 CPU (``qemu-x86_64 -cpu Haswell-v4``), where ONNX Runtime
picks its AVX2 kernels (no VNNI) as it would on an AVX2-only box, and bulkinfer sees an
AVX2 machine (its detection checks /proc/cpuinfo against what the process executes).

Usage: .venv/bin/python bench/bench_int8_avx2_emulated.py [ROWS] [--search]   (needs qemu-user)

On ROWS catalog rows (default 64; the gate's sample is all of them), each a whole
``bulkinfer run`` with runtime.precision = int8 whose report.json gives the gate's figures:

- native: this machine's own kernels and scheme;
- emulated AVX2, bulkinfer's scheme there (7-bit weights, ``reduce_range``);
- emulated AVX2 with 8-bit weights forced (what the scheme avoids: the u8s8 kernels'
  16-bit pair sums saturate);
- with ``--search``, emulated AVX2 at quality_floor 0.995 (above what full int8 reaches):
  the search for the blocks to keep in fp32 from bulkinfer's scheme (several builds and gate
  runs, each minutes long under emulation).

About 25 minutes for 64 rows on a 2-core machine (the 8-bit variant's gate fails and
searches too).

Accuracy only: under emulation every instruction is translated (about 100x slower), so no
speed is reported; speed on AVX2 needs the real machine (bench/bench_run.py there).
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
WORK = ROOT / "bench" / "_work" / "avx2_emulated"
QEMU = ["qemu-x86_64", "-cpu", "Haswell-v4"]
# a job in one process, with int8's weights forced to 8 bits when asked (bench only: not a setting)
JOB = """
import sys
if sys.argv[1] == "8bit":
    import bulkinfer.engines.ort_engine as ort_engine, bulkinfer.core.hardware as hardware
    hardware.int8_scheme = ort_engine.int8_scheme = lambda: {"reduce_range": False}
sys.argv[1:2] = []
from bulkinfer.cli import app
app(prog_name="bulkinfer")
"""
VARIANTS = {
    "native (this machine's kernels)": ([], "scheme", []),
    "emulated AVX2, bulkinfer's scheme (7-bit weights)": (QEMU, "scheme", []),
    "emulated AVX2, 8-bit weights forced": (QEMU, "8bit", []),
}
SEARCH = {"emulated AVX2, floor 0.995 (the search)": (QEMU, "scheme", ["--set", "runtime.quality_floor=0.995"])}


def job(prefix: list[str], weights: str, extra: list[str], corpus: Path, rows: int) -> dict:
    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    args = ["run", "-i", str(corpus), "-m", "minilm", "--text-column", "description", "--id-column", "id",
            "-o", str(out), "--progress", "none", "-q", "--set", "runtime.precision=int8",
            "--set", f"runtime.quality_sample_rows={rows}", *extra]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BULKINFER_CACHE": str(WORK / "cache")}
    proc = subprocess.run([*prefix, sys.executable, "-c", JOB, weights, *args], capture_output=True, text=True, env=env)
    report_path = out / "_bulkinfer" / "report.json"
    if not report_path.is_file():  # refused before a report: the one-line error is the figure
        lines = [x for x in proc.stderr.splitlines() if "TCG doesn't support" not in x]
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    report = json.loads(report_path.read_text())
    return {"machine": report["machine"], "quality": report.get("quality") or {}, "exit": proc.returncode}


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from machine import describe

    if shutil.which(QEMU[0]) is None:
        sys.exit("bench_int8_avx2_emulated: qemu-x86_64 is not installed (apt-get install qemu-user)")
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 64
    variants = {**VARIANTS, **(SEARCH if "--search" in sys.argv else {})}
    print(describe())
    shutil.rmtree(WORK / "cache", ignore_errors=True)  # every figure from this run: no cached int8 choice
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = WORK / f"corpus-{rows}.parquet"
    if not corpus.exists():
        subprocess.run([sys.executable, str(SHARED / "make_corpus.py"), str(corpus), str(rows)], check=True)
    print(f"{rows} rows, gate on all of them; MiniLM int8 against fp32 (accuracy only)\n")
    for name, (prefix, weights, extra) in variants.items():
        t0 = time.perf_counter()
        got = job(prefix, weights, extra, corpus, rows)
        wall = time.perf_counter() - t0
        if "error" in got:
            print(f"{name}: {got['error']}  [{wall:.0f} s]")
            continue
        m, q = got["machine"], got["quality"]
        figures = ", ".join(f"{k} {q[k]}" for k in ("mean_cosine", "min_cosine", "top10_overlap") if k in q)
        kept = q.get("int8_fp32_groups")
        full = q.get("full_int8_mean_cosine")
        more = f"; full int8 {full}, kept in fp32: {', '.join(kept)}" if kept else ""
        print(f"{name}: {figures}, passed {q.get('passed')}{more}  [{m['isa']}; {wall:.0f} s]")


if __name__ == "__main__":
    main()
