"""The same job on this machine's CPU and on an AVX2-only view of it, in real processes:
``bench/as_avx2.py`` preloads ``bench/cpu/hide_avx512.c``, which answers CPUID with AVX-512,
VNNI, bf16 and AMX hidden (every other instruction runs natively), so ONNX Runtime, torch and
numpy pick their AVX2 kernels as on an AVX2-only box. bulkinfer must follow the CPU the
process is shown, not /proc/cpuinfo: report.json's machine, the int8 scheme, the compiled-model
cache key (nothing built for one kind is reused on the other) and the one-line warnings."""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

import pytest

from helpers import cli, make_catalog, read_output, write

ROOT = Path(__file__).resolve().parents[2]


def _why_not() -> str | None:
    if platform.machine() != "x86_64":
        return "CPUID masking is for x86_64"
    if "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        return "this CPU or VM has no CPUID faulting (cpuid_fault)"
    if not (shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler to build the CPUID shim"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@pytest.fixture(scope="module")
def avx2_env() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from as_avx2 import environ
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return environ()


def _claimed() -> list[str]:
    """The features /proc/cpuinfo lists (what the mask hides from is the host's list, whatever
    this process is shown)."""
    from bulkinfer.core.hardware import parse_cpuinfo

    return list(parse_cpuinfo(Path("/proc/cpuinfo").read_text(), platform.machine())["features"])


def _run(tmp: Path, out: str, env: dict[str, str] | None, precision: str, rows: int, model: Path) -> tuple[dict, str]:
    proc = cli(
        "run", "-i", "in.parquet", "-m", str(model), "--text-column", "description", "--id-column", "id",
        "-o", out, "--progress", "none", "--limit-rows", str(rows),
        "--set", f"runtime.precision={precision}", "--set", f"runtime.quality_sample_rows={rows}",
        "--set", f"runtime.cache_dir={tmp / 'cache'}", "--set", "runtime.quality_floor=-1",
        cwd=tmp, env=env, check=True,
    )  # fmt: skip
    return json.loads((tmp / out / "_bulkinfer" / "report.json").read_text()), proc.stderr


def test_an_avx2_only_cpu_gets_its_own_int8_build_and_the_warnings_that_fit_it(tmp_path, avx2_env, tiny):
    from bulkinfer.core.hardware import has, isa_key

    write(make_catalog(40, seed=5), tmp_path / "in.parquet")
    masked, masked_log = _run(tmp_path, "avx2", avx2_env, "int8", 40, tiny)
    native, native_log = _run(tmp_path, "native", None, "int8", 40, tiny)

    # the masked process is an AVX2 machine; what /proc/cpuinfo adds is listed, not used
    assert masked["machine"]["isa"] == "x86_64:avx2" and native["machine"]["isa"] == isa_key()
    assert masked["machine"].get("unconfirmed", []) == sorted(set(_claimed()) - {"avx2"})
    # no VNNI there: 7-bit int8 weights, said in one line before the run; natively only when it lacks VNNI
    vnni_here = has("avx512_vnni", "avx_vnni", "amx_int8")
    assert masked_log.count("has no VNNI dot-product instructions") == 1
    assert ("has no VNNI" in native_log) == (not vnni_here)
    # one int8 build per machine kind, each recording the kind and scheme it was made for
    metas = [json.loads(m.read_text()) for m in (tmp_path / "cache" / "onnx").glob("*/meta.json")]
    int8 = {m["isa"]: m["reduce_range"] for m in metas if m["precision"] == "int8"}
    assert int8 == {"x86_64:avx2": True, isa_key(): not vnni_here}
    # both are gated on all 40 rows (each its own int8: not fp32's figures), and write them all
    for report in (masked, native):
        q = report["quality"]
        assert q["rows"] == 40 and q["passed"] is True and q["mean_cosine"] < 0.9999
    assert read_output(tmp_path / "avx2").num_rows == read_output(tmp_path / "native").num_rows == 40


def test_bf16_on_a_cpu_without_bf16_is_warned_as_emulated_before_the_run(tmp_path, avx2_env, tiny):
    write(make_catalog(8, seed=6), tmp_path / "in.parquet")
    report, log = _run(tmp_path, "bf16", avx2_env, "bf16", 8, tiny)
    (line,) = [x for x in log.splitlines() if "bf16 is emulated" in x]
    assert "this CPU (x86_64:avx2) has no bf16 instructions" in line and "use fp32, or int8" in line
    assert report["engine"] == "torch" and report["precision"] == "bf16" and report["rows_out"] == 8


def test_machine_shows_the_cpu_the_process_is_given(avx2_env):
    masked = json.loads(cli("machine", "--json", env=avx2_env, check=True).stdout)
    # on an AVX-512 box the mask hides what /proc/cpuinfo adds to AVX2; on an AVX2-only box, nothing
    hidden = sorted(set(_claimed()) - {"avx2"})
    assert masked["isa"] == "x86_64:avx2" and masked["cpu"].get("unconfirmed", []) == hidden
    verdicts = {(r["device"], r["precision"]): r["verdict"] for r in masked["precisions"]}
    assert verdicts[("cpu", "fp32")] == "native" and verdicts[("cpu", "int8")] == "weak kernels"
    assert verdicts[("cpu", "bf16")] == verdicts[("cpu", "fp16")] == "emulated"
