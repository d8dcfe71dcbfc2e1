"""What every benchmark prints beside its figures: the CPU and the flags its fast paths
depend on (one 2-core box kind has come with AVX-512/VNNI/bf16 and with AVX2 only).
The detection is bulkinfer's own (``bulkinfer.core.hardware``), the one report.json records."""

from __future__ import annotations


def cpu_flags() -> str:
    from bulkinfer.core.hardware import cpu

    return " ".join(cpu()["features"]) or "none of the fast-path features"


def describe() -> str:
    """``cpu: <model> x<cpus>; cpu flags: avx2 ...``"""
    from bulkinfer.core.hardware import cpu

    c = cpu()
    line = f"cpu: {c['model']} x{c['cpus']}; cpu flags: {cpu_flags()}"
    if c.get("unconfirmed"):  # /proc/cpuinfo describes a host the process is not shown whole (emulator, CPUID mask)
        line += f" (/proc/cpuinfo also lists {' '.join(c['unconfirmed'])}: not available to this process)"
    return line
