"""What the machine can do fast, detected once from ``/proc/cpuinfo`` (no import of torch or
onnxruntime): the instruction sets the CPU fast paths depend on. One 2-core cloud box kind
has come with AVX-512/VNNI/bf16 and with AVX2 only; bf16 without bf16 instructions is
emulated (measured 5x slower than fp32 there) and dynamic int8 without dot-product
instructions runs kernels whose sums saturate.

Used by ``report.json`` (``machine``), the compiled-model cache and ``tune``'s measurements
(both keyed by :func:`isa_key`, so nothing made for one kind of machine is reused on
another), the warnings before a run, and the benchmarks' output.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["CPU_FEATURES", "cpu", "emulated", "emulation_warning", "has", "isa_key", "parse_cpuinfo"]

# flag in /proc/cpuinfo -> the name bulkinfer reports
CPU_FEATURES = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16",
    "amx_tile": "amx",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    "asimd": "neon",
    "sve": "sve",
    "bf16": "arm_bf16",
    "i8mm": "i8mm",
    "asimddp": "arm_dotprod",
}


def parse_cpuinfo(text: str, arch: str) -> dict[str, Any]:
    """The model and features a ``/proc/cpuinfo`` text describes (x86 ``flags``, ARM ``Features``)."""
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "CPU part") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    features = sorted({name for flag, name in CPU_FEATURES.items() if flag in flags})
    return {"model": model or arch, "arch": arch, "features": features}


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, Any]:
    """``{"model", "arch", "cpus", "features": [...]}`` of this machine."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    out = parse_cpuinfo(text, platform.machine())
    out["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return out


def has(*names: str) -> bool:
    """Whether the CPU has any of ``names``."""
    return bool(set(names) & set(cpu()["features"]))


def isa_key() -> str:
    """The machine kind an artefact or a measurement holds for: architecture and fast-path features."""
    c = cpu()
    return f"{c['arch']}:{'+'.join(c['features']) or 'baseline'}"


def int8_scheme() -> dict[str, bool]:
    """How int8 weights are quantized for this CPU: on x86 without VNNI the u8s8 kernels add
    pairs of products in 16 bits, which saturate with 8-bit weights, so weights use 7 bits
    (``reduce_range``); measured on an AVX2 machine: min cosine to fp32 0.981 -> 0.986, same speed."""
    x86 = cpu()["arch"] in ("x86_64", "AMD64", "i686")
    return {"reduce_range": x86 and not has("avx512_vnni", "avx_vnni", "amx_int8")}


def emulated(device: str, precision: str) -> bool:
    """Whether ``precision`` has no instructions of its own here: bf16 on a CPU without bf16
    (AVX-512 bf16, AMX, or ARM's bf16), computed in fp32 and converted back, slower than fp32."""
    if device.startswith("cuda") or precision != "bf16":
        return False
    x86 = cpu()["arch"] in ("x86_64", "AMD64", "i686")
    return not (has("avx512_bf16", "amx_bf16") if x86 else has("arm_bf16"))


def emulation_warning(device: str, precision: str) -> str | None:
    """One line when ``precision`` runs emulated or on weak kernels on this CPU (None: it fits)."""
    arch = cpu()["arch"]
    x86 = arch in ("x86_64", "AMD64", "i686")
    if device.startswith("cuda") or precision == "fp32":
        return None
    if emulated(device, precision):
        return (
            f"runtime.precision = bf16: this CPU ({isa_key()}) has no bf16 instructions, so bf16 is emulated and "
            "slower than fp32 (measured 5x slower on an AVX2-only machine); use fp32, or int8 with its quality gate"
        )
    if precision == "int8" and x86 and not has("avx512_vnni", "avx_vnni", "amx_int8"):
        return (
            f"runtime.precision = int8: this CPU ({isa_key()}) has no VNNI dot-product instructions; int8 weights use "
            "7 bits so its kernels do not saturate (gate figures lower than on VNNI machines); the quality gate decides"
        )
    return None
