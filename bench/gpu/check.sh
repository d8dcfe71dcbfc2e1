#!/usr/bin/env bash
# The GPU check (issue 18, part 4), one prepared run on the device machine.
#   device tool: run(command="bash bench/gpu/check.sh", carry=[".gpukit"], timeout_s=540)
#   dry run here, on the CPU, small:  bash bench/gpu/check.sh --dry-run
# Needs .gpukit/ from `.venv/bin/python bench/gpu/pack.py`. Everything it prints also goes
# to $OUT/gpu_check.log, and its figures to $OUT/gpu_check.json (they come back even on a timeout).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-$PWD/bench/_work/gpu_out}
mkdir -p "$OUT"
if [[ "${1:-}" == "--dry-run" ]]; then
    PY=${PY:-.venv/bin/python}
    "$PY" bench/gpu/check.py --device cpu --rows 600 --serve-requests 64 --budget-s 900 --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
    exit
fi
[[ -d .gpukit/whl ]] || { echo "no .gpukit: run .venv/bin/python bench/gpu/pack.py here first"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukit/whl/*.whl || exit 3
export PYTHONPATH="$PWD/src:/tmp/site:$PWD/.gpukit/site"
export BULKINFER_GPU_MODEL=/tmp/bulkinfer-minilm BULKINFER_SHARED_BENCH="$PWD/.gpukit/shared_bench"
python3 - <<'PY' || exit 4
import shutil, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(".gpukit/minilm"), Path("/tmp/bulkinfer-minilm")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.fp16.safetensors"))
half = load_file(str(src / "model.fp16.safetensors"))
save_file({k: (t.float() if t.is_floating_point() else t) for k, t in half.items()}, str(dst / "model.safetensors"),
          metadata={"format": "pt"})
print(f"model restored to fp32 in {dst}")
PY
python3 bench/gpu/check.py --device cuda --rows "${ROWS:-100000}" --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
