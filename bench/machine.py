"""What every benchmark prints beside its figures: the CPU and the flags its fast paths
depend on (one 2-core box kind has come with AVX-512/VNNI/bf16 and with AVX2 only)."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

WANTED = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def cpu_flags() -> str:
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    flags = set(line.split(":", 1)[1].split())
    return " ".join(f for f in WANTED if f in flags) or "none of " + ",".join(WANTED)


def describe() -> str:
    """``cpu: <model> x<cpus>; cpu flags: avx2 ...``"""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(x.split(":", 1)[1].strip() for x in lines if x.startswith("model name"))
    return f"cpu: {model} x{len(os.sched_getaffinity(0))}; cpu flags: {cpu_flags()}"
