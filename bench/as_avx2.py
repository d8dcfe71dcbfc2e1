"""Run a command as if on an AVX2-only x86 machine, at native speed: every library in it
(ONNX Runtime's MLAS, torch's oneDNN and ATen, numpy) dispatches its AVX2 kernels, no
AVX-512, VNNI, bf16 or AMX, and bulkinfer's detection sees ``x86_64:avx2``.

Usage: .venv/bin/python bench/as_avx2.py COMMAND [ARG...]
  e.g. .venv/bin/python bench/as_avx2.py .venv/bin/python bench/bench_run.py 2000 --only default,int8

How: bench/cpu/hide_avx512.c, built here with the C compiler into bench/_work/, is preloaded
into the command and its children (Ray's workers too); it turns on the kernel's CPUID
faulting and answers every CPUID with the AVX-512/VNNI/bf16/AMX bits cleared. Only CPUID
is trapped, so figures are native speed on this CPU's cores running AVX2 code: the same
kernels as an AVX2 box, not its microarchitecture (clock, cache, ports differ), so compare
ratios within one run. Needs Linux on x86 with CPUID faulting (``cpuid_fault`` in
/proc/cpuinfo: Intel since Ivy Bridge, AMD Zen 4 and a kernel from 6.x, and most VMs that
pass it through); without it the command is refused, not run unmasked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "cpu" / "hide_avx512.c"
SHIM = ROOT / "bench" / "_work" / "hide_avx512.so"


def shim() -> Path:
    """The preload library, built from its source when missing or older than it."""
    if not SHIM.exists() or SHIM.stat().st_mtime < SOURCE.stat().st_mtime:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            sys.exit("as_avx2: no C compiler (cc or gcc) to build bench/cpu/hide_avx512.c: install gcc")
        SHIM.parent.mkdir(parents=True, exist_ok=True)
        tmp = SHIM.with_suffix(".tmp")
        subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl"], check=True)
        tmp.replace(SHIM)
    return SHIM


def environ(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the shim preloaded."""
    env = dict(os.environ if env is None else env)
    env["LD_PRELOAD"] = " ".join(p for p in (str(shim()), env.get("LD_PRELOAD", "")) if p)
    return env


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        sys.exit(
            "as_avx2: this CPU or VM has no CPUID faulting (no cpuid_fault in /proc/cpuinfo): nothing can be hidden"
        )
    env = environ()
    os.execvpe(sys.argv[1], sys.argv[1:], env)


if __name__ == "__main__":
    main()
