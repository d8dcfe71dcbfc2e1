"""What the machine can do fast, detected once from ``/proc/cpuinfo`` and checked against what
this process can execute (numpy's runtime CPU detection; no import of torch or onnxruntime):
the instruction sets the CPU fast paths depend on. One 2-core cloud box kind
has come with AVX-512/VNNI/bf16 and with AVX2 only; bf16 without bf16 instructions is
emulated (measured 5x slower than fp32 there) and dynamic int8 without dot-product
instructions runs kernels whose sums saturate.

The GPU, when ``runtime.device`` names one, comes from torch's own queries (:func:`gpu`):
bf16 has tensor cores from compute capability 8.0 (A100, L4, H100) and is emulated below it
(T4, V100), where fp16 is the fast precision.

Used by ``report.json`` (``machine``), the compiled-model cache and ``tune``'s measurements
(both keyed by :func:`isa_key`, tune's by :func:`gpu` too, so nothing made for one kind of
machine is reused on another), the warnings before a run, the benchmarks' output, and
``bulkinfer machine`` (:func:`survey`).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

__all__ = [
    "CPU_FEATURES",
    "ORT_GPU_PROVIDERS",
    "RUNTIME_NAMES",
    "available_cpus",
    "confirm",
    "cpu",
    "cpu_quota",
    "device_here",
    "emulated",
    "emulation_warning",
    "feed_the_gpu",
    "gpu",
    "has",
    "isa_key",
    "parse_cpuinfo",
    "quiet_tokenizers",
    "require_device",
    "survey",
]

# flag in /proc/cpuinfo -> the name bulkinfer reports
CPU_FEATURES = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    "amx_fp16": "amx_fp16",
    "asimd": "neon",
    "sve": "sve",
    "bf16": "arm_bf16",
    "asimdhp": "arm_fp16",
    "i8mm": "i8mm",
    "asimddp": "arm_dotprod",
}


def available_cpus() -> int:
    """CPUs this process may use: those it may run on (taskset, cgroups' cpusets), at most its
    CPU quota (a container's ``limits.cpu``: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)
    rounded down, at least 1. A pod limited to 2 CPUs on a 64-core node gets 2 threads, not 64:
    rounded up, a quota of 1.5 would run 2 threads throttled half the time."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cpus, int(quota))) if quota is not None else cpus


def cpu_quota(root: Path = Path("/")) -> float | None:
    """The CPUs this process's cgroups allow (the least along its cgroup's path), or None for
    no quota; ``root``: where ``proc/`` and ``sys/`` are (tests give a folder shaped like them)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            quotas += _along(root / "sys/fs/cgroup", path, _v2_quota)
        elif "cpu" in controllers.split(","):
            quotas += _along(root / "sys/fs/cgroup" / controllers, path, _v1_quota)
    return min(quotas) if quotas else None


def _along(mount: Path, path: str, read: Any) -> list[float]:
    """Each quota from the cgroup ``path`` up to the mount's root (a container's own cgroup is
    often the mount's root itself: its path outside is not visible inside)."""
    found = []
    here = mount / path.strip("/")
    for folder in (here, *here.parents):
        if folder == mount.parent:
            break
        quota = read(folder)
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(folder: Path) -> float | None:
    try:
        limit, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) / int(period)


def _v1_quota(folder: Path) -> float | None:
    try:
        limit = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if limit <= 0 or period <= 0 else limit / period


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


# bulkinfer's name -> numpy's name for the same feature in its runtime (CPUID and OS state) detection
RUNTIME_NAMES = {
    "avx2": "AVX2",
    "avx512f": "AVX512F",
    "avx512_vnni": "AVX512VNNI",
    "avx512_bf16": "AVX512BF16",
    "avx512_fp16": "AVX512FP16",
    "neon": "ASIMD",
    "arm_dotprod": "ASIMDDP",
    "arm_fp16": "ASIMDHP",
    "sve": "SVE",
}


def confirm(parsed: dict[str, Any], runtime: dict[str, bool] | None) -> dict[str, Any]:
    """``parsed`` (from ``/proc/cpuinfo``) checked against what this process can execute
    (``runtime``: numpy's CPUID-and-OS detection, None when unavailable). Under an emulator or
    a sandbox ``/proc/cpuinfo`` can describe the host while the CPU the process sees has less
    (qemu's ``-cpu Haswell`` on an AVX-512 host): the kernels follow the CPU, so when any
    claimed feature does not execute, only the features the process confirms are kept (the
    ones numpy cannot check, AMX or AVX-VNNI, are dropped with the rest) and ``unconfirmed``
    lists what was dropped."""
    if runtime is None:
        return parsed
    claimed = parsed["features"]
    # a feature this numpy does not know (an older one has no AVX512FP16) is not a refusal
    absent = {f for f in claimed if runtime.get(RUNTIME_NAMES.get(f, ""), True) is False}
    if not absent:
        return parsed
    kept = [f for f in claimed if runtime.get(RUNTIME_NAMES.get(f, "")) is True]
    return {**parsed, "features": kept, "unconfirmed": sorted(set(claimed) - set(kept))}


def _runtime_features() -> dict[str, bool] | None:
    import importlib

    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2, numpy 1
        try:
            return dict(importlib.import_module(module).__cpu_features__)
        except (ImportError, AttributeError):
            continue
    return None


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, Any]:
    """``{"model", "arch", "cpus", "features": [...]}`` of this machine (``unconfirmed`` too when
    ``/proc/cpuinfo`` claims features this process cannot execute: see :func:`confirm`)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    out = confirm(parse_cpuinfo(text, platform.machine()), _runtime_features())
    out["cpus"] = available_cpus()
    out["cpu_quota"] = cpu_quota()
    return out


def has(*names: str) -> bool:
    """Whether the CPU has any of ``names``."""
    return bool(set(names) & set(cpu()["features"]))


def isa_key() -> str:
    """The machine kind an artefact or a measurement holds for: architecture and fast-path features."""
    c = cpu()
    return f"{c['arch']}:{'+'.join(c['features']) or 'baseline'}"


@functools.lru_cache(maxsize=8)
def gpu(device: str) -> dict[str, Any] | None:
    """``{"name", "capability", "memory_gib", "count"}`` of the GPU ``device`` names, from torch's
    own queries (torch is imported only for a ``cuda`` device); None for a CPU device or when
    torch sees no GPU."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.device(device).index
        props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
        count = torch.cuda.device_count()
    except (ImportError, RuntimeError, AssertionError, ValueError):
        return None
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "count": count,
    }


def device_here(device: str) -> bool:
    """Whether this process can run on ``device`` (a GPU job's Ray driver often has no GPU)."""
    return not device.startswith("cuda") or gpu(device) is not None


def require_device(device: str) -> None:
    """Raise a one-line :class:`ConfigError` when ``device`` is a GPU torch cannot use here."""
    if device_here(device):
        return
    import torch

    from .errors import ConfigError

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    seen = torch.cuda.device_count() if torch.version.cuda else 0
    raise ConfigError(
        f"runtime.device = {device}: torch {torch.__version__} ({build}) sees {seen} GPU(s) here; "
        "set runtime.device = cpu, or run where the GPU and a CUDA build of torch are"
    )


def _capability(info: dict[str, Any]) -> tuple[int, int]:
    major, _, minor = str(info["capability"]).partition(".")
    return int(major), int(minor or 0)


_TOKENIZER_THREADS_CHOSEN_HERE = False


def quiet_tokenizers() -> None:
    """Hugging Face tokenizers' own threads off, unless ``TOKENIZERS_PARALLELISM`` is set: on a
    CPU they take the cores inference runs on (and warn when a process forks)."""
    global _TOKENIZER_THREADS_CHOSEN_HERE
    if "TOKENIZERS_PARALLELISM" not in os.environ:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        _TOKENIZER_THREADS_CHOSEN_HERE = True


def feed_the_gpu(device: str) -> None:
    """On a GPU the reader thread's tokenizer is what feeds the device while the host's cores
    idle: let it use them, unless the user set ``TOKENIZERS_PARALLELISM`` themselves."""
    if device.startswith("cuda") and _TOKENIZER_THREADS_CHOSEN_HERE:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"


def int8_scheme() -> dict[str, bool]:
    """How int8 weights are quantized for this CPU: on x86 without VNNI the u8s8 kernels add
    pairs of products in 16 bits, which saturate with 8-bit weights, so weights use 7 bits
    (``reduce_range``); measured on an AVX2 machine: min cosine to fp32 0.981 -> 0.986, same speed."""
    x86 = cpu()["arch"] in ("x86_64", "AMD64", "i686")
    return {"reduce_range": x86 and not has("avx512_vnni", "avx_vnni", "amx_int8")}


def emulated(device: str, precision: str) -> bool:
    """Whether ``precision`` has no instructions of its own here, so it is computed in fp32 and
    converted back, slower than fp32: bf16 on a CPU without bf16 (AVX-512 bf16, AMX, or ARM's
    bf16) or on a GPU below compute capability 8.0; fp16 on a CPU without fp16 arithmetic
    (AVX-512 fp16, AMX fp16, ARM's half-precision SIMD)."""
    if precision not in ("bf16", "fp16"):
        return False
    if device.startswith("cuda"):
        info = gpu(device)
        return precision == "bf16" and info is not None and _capability(info) < (8, 0)
    x86 = cpu()["arch"] in ("x86_64", "AMD64", "i686")
    if precision == "fp16":
        return not (has("avx512_fp16", "amx_fp16") if x86 else has("arm_fp16"))
    return not (has("avx512_bf16", "amx_bf16") if x86 else has("arm_bf16"))


def emulation_warning(device: str, precision: str) -> str | None:
    """One line when ``precision`` runs emulated or on weak kernels on this CPU (None: it fits)."""
    arch = cpu()["arch"]
    x86 = arch in ("x86_64", "AMD64", "i686")
    if precision == "fp32":
        return None
    if emulated(device, precision) and device.startswith("cuda"):
        info = gpu(device) or {}
        return (
            f"runtime.precision = bf16: this GPU ({info.get('name')}, compute capability {info.get('capability')}) "
            "has no bf16 tensor cores (they start at 8.0), so bf16 is emulated and slow; use fp16"
        )
    if emulated(device, precision):
        slower = "measured 5x slower on an AVX2-only machine" if precision == "bf16" else "far slower"
        return (
            f"runtime.precision = {precision}: this CPU ({isa_key()}) has no {precision} instructions, so "
            f"{precision} is emulated and slower than fp32 ({slower}); use fp32, or int8 with its quality gate"
        )
    if device.startswith("cuda"):
        return None
    if precision == "int8" and x86 and not has("avx512_vnni", "avx_vnni", "amx_int8"):
        return (
            f"runtime.precision = int8: this CPU ({isa_key()}) has no VNNI dot-product instructions; int8 weights use "
            "7 bits so its kernels do not saturate (gate figures lower than on VNNI machines); the quality gate decides"
        )
    return None


# onnxruntime's GPU providers bulkinfer uses -> (its name, how to install it, the setting to use instead)
ORT_GPU_PROVIDERS = {
    "CUDAExecutionProvider": ("CUDA", "pip install onnxruntime-gpu", "runtime.engine = torch"),
    "TensorrtExecutionProvider": ("TensorRT", "pip install onnxruntime-gpu tensorrt", "runtime.tensorrt = false"),
}


def _libraries() -> dict[str, Any]:
    """The installed inference libraries and what they can run on (imports onnxruntime; torch's
    CUDA build is read from its version, not by importing it)."""
    from importlib.metadata import PackageNotFoundError, version

    libs: dict[str, Any] = {}
    for name in ("torch", "onnxruntime", "onnxruntime-gpu", "openvino", "nncf", "tensorrt", "vllm"):
        try:
            libs[name] = version(name)
        except PackageNotFoundError:
            continue
    try:
        import onnxruntime

        libs["onnxruntime_providers"] = list(onnxruntime.get_available_providers())
    except ImportError:
        libs["onnxruntime_providers"] = []
    return libs


def survey(device: str = "cuda", libraries: dict[str, Any] | None = None) -> dict[str, Any]:
    """What runs fast here, for ``bulkinfer machine``: the CPU (:func:`cpu`), the GPU ``device``
    names (:func:`gpu`; None when torch sees none), the inference libraries (``libraries``
    injects them), and a verdict for each engine and precision bulkinfer can run: ``native``,
    ``weak kernels``, ``emulated`` or ``unavailable``, with a note on why and what to use instead."""
    libs = _libraries() if libraries is None else libraries
    card = gpu(device)
    rows: list[dict[str, Any]] = []

    def add(where: str, engine: str, precision: str, verdict: str, note: str) -> None:
        rows.append({"device": where, "engine": engine, "precision": precision, "verdict": verdict, "note": note})

    add("cpu", "onnxruntime", "fp32", "native", "the default")
    if emulation_warning("cpu", "int8"):
        add(
            "cpu", "onnxruntime", "int8", "weak kernels", "no VNNI: 7-bit weights, lower gate figures; the gate decides"
        )
    else:
        add("cpu", "onnxruntime", "int8", "native", "8-bit weights, through the quality gate")
    if "openvino" in libs:
        add("cpu", "openvino", "fp32", "native", "runtime.engine = openvino")
        if "nncf" not in libs:
            add("cpu", "openvino", "int8", "unavailable", "needs nncf: pip install 'bulkinfer[openvino]'")
        elif emulation_warning("cpu", "int8"):
            add("cpu", "openvino", "int8", "weak kernels", "no VNNI: int8 weights, activations per group of 64")
        else:
            add("cpu", "openvino", "int8", "native", "int8 weights, activations per group of 64; gated")
    else:
        add("cpu", "openvino", "fp32", "unavailable", "pip install 'bulkinfer[openvino]'")
        add("cpu", "openvino", "int8", "unavailable", "pip install 'bulkinfer[openvino]'")
    for precision in ("bf16", "fp16"):
        slow = f"no {precision} instructions: slower than fp32; use fp32 or int8"
        add("cpu", "torch", precision, *(("emulated", slow) if emulated("cpu", precision) else ("native", "gated")))
    if card is None:
        add(device, "torch", "fp32/fp16/bf16", "unavailable", f"torch sees no GPU for runtime.device = {device}")
    else:
        add(device, "torch", "fp32", "native", "the GPU default (runtime.engine = auto)")
        add(device, "torch", "fp16", "native", "gated")
        no_bf16 = "no bf16 tensor cores below compute capability 8.0; use fp16"
        add(device, "torch", "bf16", *(("emulated", no_bf16) if emulated(device, "bf16") else ("native", "gated")))
        for provider, engine, precisions, how in (
            ("CUDAExecutionProvider", "onnxruntime", "fp32", ""),
            ("TensorrtExecutionProvider", "onnxruntime + tensorrt", "fp32/fp16", "runtime.tensorrt = true"),
        ):
            if provider in libs.get("onnxruntime_providers", []):
                add(device, engine, precisions, "native", how)
            else:
                install = ORT_GPU_PROVIDERS[provider][1]
                add(device, engine, precisions, "unavailable", f"this onnxruntime has no {provider}; {install}")
    return {"cpu": cpu(), "isa": isa_key(), "gpu": card, "libraries": libs, "precisions": rows}
