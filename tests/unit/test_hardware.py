"""CPU feature detection and the emulation warnings, on cpuinfo texts of three machine kinds."""

from __future__ import annotations

import pytest

from bulkinfer import hardware

AVX2 = "processor : 0\nmodel name : AMD EPYC\nflags : fpu sse2 avx avx2 fma\n"
SAPPHIRE = "model name : Intel Xeon\nflags : avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8\n"
GRAVITON = "processor : 0\nFeatures : fp asimd asimddp sve i8mm bf16\nCPU part : 0xd40\n"


@pytest.mark.parametrize(
    ("text", "arch", "features", "bf16_warns", "int8_warns"),
    [
        (AVX2, "x86_64", ["avx2"], True, True),
        (SAPPHIRE, "x86_64", ["amx", "amx_bf16", "amx_int8", "avx2", "avx512_bf16", "avx512_vnni", "avx512f"], False,
         False),
        (GRAVITON, "aarch64", ["arm_bf16", "arm_dotprod", "i8mm", "neon", "sve"], False, False),
    ],
)  # fmt: skip
def test_features_and_warnings_per_machine_kind(monkeypatch, text, arch, features, bf16_warns, int8_warns):
    parsed = hardware.parse_cpuinfo(text, arch)
    assert parsed["features"] == features
    monkeypatch.setattr(hardware, "cpu", lambda: {**parsed, "cpus": 2})
    assert hardware.isa_key() == f"{arch}:{'+'.join(features)}"
    bf16 = hardware.emulation_warning("cpu", "bf16")
    int8 = hardware.emulation_warning("cpu", "int8")
    assert (bf16 is not None, int8 is not None) == (bf16_warns, int8_warns)
    if bf16:
        assert "emulated" in bf16 and "use fp32" in bf16 and hardware.isa_key() in bf16
    assert hardware.emulation_warning("cpu", "fp32") is None
    assert hardware.emulation_warning("cuda:0", "bf16") is None
    # int8 weights in 7 bits exactly where the kernels saturate: x86 without VNNI
    assert hardware.int8_scheme() == {"reduce_range": arch == "x86_64" and "avx512_vnni" not in features}


def test_this_machine_is_described_in_the_report_format():
    c = hardware.cpu()
    assert c["cpus"] >= 1 and c["arch"] and set(c["features"]) <= set(hardware.CPU_FEATURES.values())
