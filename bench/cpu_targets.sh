#!/usr/bin/env bash
# The CPU speed targets in one go, for the machine it runs on (each script prints the CPU's
# flags first; run it on each machine kind, never under a CPUID mask for a figure that counts):
#   - gate-passing int8 and both engines against the sentence-transformers script, 12,000 and 3,000 rows
#   - time to the first committed row, cold and warm, int8 against fp32; whether the gate's fp32
#     pass pays to run beside the int8 build (bench_overlap.py)
#   - the Ray backend against the Ray Data pattern
#   - where the int8 graph's time goes, per op type, and the int8 schemes side by side (issue 35 item 2)
# and ends with each target met or not (bench/targets.py) for the kind the figures came from.
# Usage: bash bench/cpu_targets.sh [OUT_DIR]   (default bench/_work/targets; ~45 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/_work/targets}"
mkdir -p "$out"
[ -x .venv/bin/python ] || make install
py=.venv/bin/python
$py bench/bench_run.py 12000 --repeat 3 --only "default,onnxruntime int8 (gated),openvino" \
    --json "$out/run-12000.json" | tee "$out/run-12000.txt"
$py bench/bench_run.py 3000 --repeat 3 --only "default,onnxruntime int8 (gated),openvino,ray" \
    --json "$out/run-3000.json" | tee "$out/run-3000.txt"
$py bench/bench_cold.py 3000 --json "$out/cold-3000.json" | tee "$out/cold-3000.txt"
$py bench/bench_overlap.py 5 | tee "$out/overlap.txt"
$py bench/profile_ops.py 1000 | tee "$out/profile-ops.txt"
$py bench/bench_int8_schemes.py 1000 --repeat 3 | tee "$out/int8-schemes.txt"
$py bench/targets.py "$out" | tee "$out/targets.txt"
echo "figures in $out/"
