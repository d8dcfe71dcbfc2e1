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


def _measured(cache, monkeypatch, text, candidates):
    """A tune result for a fake model, kept under the machine kind ``text`` describes."""
    import json

    from bulkinfer import load_config
    from bulkinfer.tune import results_path

    monkeypatch.setattr(hardware, "cpu", lambda: {**hardware.parse_cpuinfo(text, "x86_64"), "cpus": 2})
    cfg = load_config(overrides={"model.name": "m", "runtime.cache_dir": str(cache)})
    path = results_path(cfg, "d" * 64)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"engine": e, "precision": p, "batch_size": 16, "threads": 2, "rows_per_s": r, "passed": ok}
            for e, p, r, ok in candidates]  # fmt: skip
    path.write_text(json.dumps({"candidates": rows}))


@pytest.mark.parametrize(
    ("text", "engine", "expect"),
    [
        (AVX2, "auto", ("onnxruntime", "int8")),  # bf16 measured fastest, but emulated here: never chosen
        (SAPPHIRE, "auto", ("torch", "bf16")),
        (SAPPHIRE, "onnxruntime", ("onnxruntime", "int8")),  # the job's engine limits the choice
    ],
)
def test_precision_auto_is_the_fastest_measured_that_passed_and_is_not_emulated(
    tmp_path, monkeypatch, text, engine, expect
):
    from types import SimpleNamespace

    from bulkinfer import load_config
    from bulkinfer.tune import auto_precision

    measured = [("onnxruntime", "fp32", 270.0, True), ("onnxruntime", "int8", 400.0, True),
                ("torch", "fp32", 120.0, True), ("torch", "bf16", 500.0, True)]  # fmt: skip
    _measured(tmp_path, monkeypatch, text, measured)
    cfg = load_config(overrides={"model.name": "m", "runtime.cache_dir": str(tmp_path), "runtime.engine": engine})
    got = auto_precision(cfg, SimpleNamespace(digest="d" * 64))
    assert got[:2] == expect
    rate = 500.0 if expect[1] == "bf16" else 400.0
    assert got[2].startswith(f"{rate} rows/s against fp32's 270.0 (measured by bulkinfer tune, ")
    assert got[2].endswith("; bf16 left out: emulated on this CPU") == (text == AVX2)


def test_precision_auto_takes_nothing_measured_on_another_machine_kind_or_that_failed(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bulkinfer import load_config
    from bulkinfer.tune import auto_precision

    model = SimpleNamespace(digest="d" * 64)
    _measured(tmp_path, monkeypatch, SAPPHIRE, [("onnxruntime", "int8", 400.0, True)])
    monkeypatch.setattr(hardware, "cpu", lambda: {**hardware.parse_cpuinfo(AVX2, "x86_64"), "cpus": 2})
    cfg = load_config(overrides={"model.name": "m", "runtime.cache_dir": str(tmp_path)})
    engine, precision, why = auto_precision(cfg, model)  # no input to calibrate on (serve)
    assert (engine, precision) == ("onnxruntime", "fp32")
    assert why.startswith("no tune result for this model on this machine (x86_64:avx2)")
    _measured(
        tmp_path, monkeypatch, AVX2, [("onnxruntime", "int8", 400.0, False), ("onnxruntime", "fp32", 270.0, True)]
    )
    assert auto_precision(cfg, model)[:2] == ("onnxruntime", "fp32")  # int8 failed its gate here
