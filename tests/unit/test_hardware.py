"""CPU feature detection and the emulation warnings, on cpuinfo texts of three machine kinds."""

from __future__ import annotations

import os

import pytest

from bulkinfer.core import hardware

AVX2 = "processor : 0\nmodel name : AMD EPYC\nflags : fpu sse2 avx avx2 fma\n"
SAPPHIRE = (
    "model name : Intel Xeon\nflags : avx2 avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8\n"
)
GRAVITON = "processor : 0\nFeatures : fp asimd asimdhp asimddp sve i8mm bf16\nCPU part : 0xd40\n"
T4 = {"name": "Tesla T4", "capability": "7.5", "memory_gib": 14.6, "count": 1}
H100 = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.1, "count": 1}


@pytest.mark.parametrize(
    ("text", "arch", "features", "bf16_warns", "int8_warns"),
    [
        (AVX2, "x86_64", ["avx2"], True, True),
        (SAPPHIRE, "x86_64", ["amx", "amx_bf16", "amx_int8", "avx2", "avx512_bf16", "avx512_fp16", "avx512_vnni",
                              "avx512f"], False, False),
        (GRAVITON, "aarch64", ["arm_bf16", "arm_dotprod", "arm_fp16", "i8mm", "neon", "sve"], False, False),
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
    # fp16 has arithmetic of its own on Sapphire Rapids (AVX-512 fp16) and Graviton 3, not on AVX2
    fp16 = hardware.emulation_warning("cpu", "fp16")
    assert (fp16 is not None) == (text == AVX2) and hardware.emulated("cpu", "fp16") == (text == AVX2)
    if fp16:
        assert fp16.startswith(f"runtime.precision = fp16: this CPU ({hardware.isa_key()}) has no fp16 instructions")
    # int8 weights in 7 bits exactly where the kernels saturate: x86 without VNNI
    assert hardware.int8_scheme() == {"reduce_range": arch == "x86_64" and "avx512_vnni" not in features}


@pytest.mark.parametrize(("card", "bf16_emulated"), [(T4, True), (H100, False)])
def test_on_a_gpu_bf16_needs_compute_capability_8_and_fp16_runs_everywhere(monkeypatch, card, bf16_emulated):
    monkeypatch.setattr(hardware, "cpu", lambda: {**hardware.parse_cpuinfo(AVX2, "x86_64"), "cpus": 16})
    monkeypatch.setattr(hardware, "gpu", lambda device: card if device.startswith("cuda") else None)
    assert hardware.emulated("cuda:0", "bf16") == bf16_emulated
    assert not hardware.emulated("cuda", "fp16") and hardware.emulation_warning("cuda", "fp16") is None
    warning = hardware.emulation_warning("cuda", "bf16")
    if bf16_emulated:
        assert warning == (
            "runtime.precision = bf16: this GPU (Tesla T4, compute capability 7.5) has no bf16 tensor cores "
            "(they start at 8.0), so bf16 is emulated and slow; use fp16"
        )
    else:
        assert warning is None
    # the CPU's int8 note is about the CPU's kernels: not said for a GPU job
    assert hardware.emulation_warning("cuda", "int8") is None


def test_a_gpu_device_without_a_gpu_is_one_line_naming_the_device(monkeypatch):
    from bulkinfer import ConfigError

    if hardware.gpu("cuda") is not None:
        pytest.skip("this machine has a GPU")
    hardware.require_device("cpu")  # nothing to check
    with pytest.raises(ConfigError) as err:
        hardware.require_device("cuda:1")
    line = str(err.value)
    assert line.startswith("runtime.device = cuda:1: torch ") and "sees 0 GPU(s) here" in line
    assert line.endswith("set runtime.device = cpu, or run where the GPU and a CUDA build of torch are")
    assert "\n" not in line


def test_tokenizer_threads_off_on_a_cpu_on_for_a_gpu_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(hardware, "_TOKENIZER_THREADS_CHOSEN_HERE", False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    hardware.quiet_tokenizers()
    hardware.feed_the_gpu("cpu")
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    hardware.feed_the_gpu("cuda:0")
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    monkeypatch.setattr(hardware, "_TOKENIZER_THREADS_CHOSEN_HERE", False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # the user's choice stands
    hardware.quiet_tokenizers()
    hardware.feed_the_gpu("cuda")
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_this_machine_is_described_in_the_report_format():
    c = hardware.cpu()
    assert c["cpus"] >= 1 and c["arch"] and set(c["features"]) <= set(hardware.CPU_FEATURES.values())


def _measured(cache, monkeypatch, text, candidates, **overrides):
    """A tune result for a fake model, kept under the machine kind ``text`` describes."""
    import json

    from bulkinfer import load_config
    from bulkinfer.precision.tune import results_path

    monkeypatch.setattr(hardware, "cpu", lambda: {**hardware.parse_cpuinfo(text, "x86_64"), "cpus": 2})
    cfg = load_config(overrides={"model.name": "m", "runtime.cache_dir": str(cache), **overrides})
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
    from bulkinfer.precision.tune import auto_precision

    measured = [("onnxruntime", "fp32", 270.0, True), ("onnxruntime", "int8", 400.0, True),
                ("torch", "fp32", 120.0, True), ("torch", "bf16", 500.0, True)]  # fmt: skip
    _measured(tmp_path, monkeypatch, text, measured)
    cfg = load_config(overrides={"model.name": "m", "runtime.cache_dir": str(tmp_path), "runtime.engine": engine})
    got = auto_precision(cfg, SimpleNamespace(digest="d" * 64))
    assert got[:2] == expect
    rate = 500.0 if expect[1] == "bf16" else 400.0
    assert got[2].startswith(f"{rate} rows/s against fp32's 270.0 (measured by bulkinfer tune, ")
    assert got[2].endswith("; bf16, fp16 left out: emulated here") == (text == AVX2)


@pytest.mark.parametrize(("card", "expect"), [(T4, "fp16"), (H100, "bf16")])
def test_precision_auto_on_a_gpu_leaves_out_bf16_below_compute_capability_8(tmp_path, monkeypatch, card, expect):
    from types import SimpleNamespace

    from bulkinfer import load_config
    from bulkinfer.precision.tune import auto_precision, results_path

    monkeypatch.setattr(hardware, "gpu", lambda device: card if device.startswith("cuda") else None)
    measured = [("torch", "fp32", 3000.0, True), ("torch", "bf16", 9000.0, True), ("torch", "fp16", 8000.0, True)]
    _measured(tmp_path, monkeypatch, AVX2, measured, **{"runtime.device": "cuda"})
    cfg = load_config(overrides={"model.name": "m", "runtime.cache_dir": str(tmp_path), "runtime.device": "cuda"})
    engine, precision, why = auto_precision(cfg, SimpleNamespace(digest="d" * 64))
    assert (engine, precision) == ("torch", expect)
    assert why.endswith("; bf16 left out: emulated here") == (card is T4)
    # measurements are kept per GPU: another card reads none of them
    other = {**card, "name": "another card"}
    monkeypatch.setattr(hardware, "gpu", lambda device: other if device.startswith("cuda") else None)
    assert not results_path(cfg, "d" * 64).exists()
    # and with nothing measured for this card, serve (no rows to calibrate on) runs fp32 on torch, not onnxruntime
    assert auto_precision(cfg, SimpleNamespace(digest="d" * 64))[:2] == ("torch", "fp32")


def test_precision_auto_takes_nothing_measured_on_another_machine_kind_or_that_failed(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bulkinfer import load_config
    from bulkinfer.precision.tune import auto_precision

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


def test_tune_tries_big_batches_and_torch_on_a_gpu_small_batches_and_every_engine_on_a_cpu():
    from bulkinfer.precision.tune import PRECISIONS, candidates_for

    assert candidates_for("cpu") == (PRECISIONS, (8, 16, 32, 64))  # openvino is installed here (the dev extra)
    pairs, sizes = candidates_for("cuda:0")
    assert pairs == (("torch", "fp32"), ("torch", "bf16"), ("torch", "fp16")) and sizes == (64, 128, 256, 512, 1024)


def test_a_text_model_on_a_gpu_runs_big_batches_unless_the_job_says_otherwise(minilm_path):
    from bulkinfer import load_config
    from bulkinfer.adapters import GPU_TEXT_BATCH
    from bulkinfer.precision.settle import settle

    def size(**overrides):
        cfg = load_config(overrides={"model.name": "minilm", "model.text_column": "t", **overrides})
        return settle(cfg).cfg.runtime.batch_size

    assert size() == 16
    assert size(**{"runtime.device": "cuda"}) == GPU_TEXT_BATCH == 256
    assert size(**{"runtime.device": "cuda", "runtime.batch_size": 16}) == 16  # said by the job: kept


def test_the_warning_before_a_run_on_weak_kernels_cites_what_tune_measured_here(tmp_path, monkeypatch, caplog):
    import json
    import logging

    from bulkinfer import load_config
    from bulkinfer.adapters import resolve_model
    from bulkinfer.job import prepare
    from bulkinfer.precision.tune import results_path

    monkeypatch.setattr(hardware, "cpu", lambda: {**hardware.parse_cpuinfo(AVX2, "x86_64"), "cpus": 2})
    cfg = load_config(overrides={"model.name": "minilm", "model.text_column": "t", "source.paths": ["in.parquet"],
                                 "sink.path": str(tmp_path / "out"), "runtime.precision": "int8",
                                 "runtime.cache_dir": str(tmp_path)})  # fmt: skip
    caplog.set_level(logging.WARNING, logger="bulkinfer")
    prepare(cfg)  # nothing measured: the warning alone
    [alone] = [r.getMessage() for r in caplog.records if "runtime.precision = int8" in r.getMessage()]
    assert alone.endswith("the quality gate decides")
    path = results_path(cfg, resolve_model(cfg).digest)
    path.parent.mkdir(parents=True)
    rows = [("onnxruntime", "fp32", 16, 260.0, True, None), ("onnxruntime", "fp32", 32, 270.0, True, None),
            ("onnxruntime", "int8", 16, 391.5, True, 0.9905), ("torch", "fp32", 16, 120.0, True, None)]  # fmt: skip
    path.write_text(json.dumps({"candidates": [
        {"engine": e, "precision": p, "batch_size": b, "rows_per_s": r, "passed": ok,
         "quality": {"mean_cosine": q} if q else None} for e, p, b, r, ok, q in rows]}))  # fmt: skip
    caplog.clear()
    prepare(cfg)
    [said] = [r.getMessage() for r in caplog.records if "runtime.precision = int8" in r.getMessage()]
    assert said == alone + (" (bulkinfer tune measured int8 here at 391.5 rows/s against fp32's 270.0 (1.45x), "
                            "gate mean cosine 0.9905)")  # fmt: skip


HASWELL = {"AVX2": True, "FMA3": True, "AVX512F": False, "AVX512VNNI": False, "AVX512BF16": False}


@pytest.mark.parametrize(
    ("text", "arch", "runtime", "features", "unconfirmed"),
    [
        # the process runs what /proc/cpuinfo says: kept as is, AMX (which numpy cannot check) included
        (SAPPHIRE, "x86_64", {n: True for n in hardware.RUNTIME_NAMES.values()}, None, None),
        (AVX2, "x86_64", HASWELL, None, None),
        (SAPPHIRE, "x86_64", None, None, None),  # no runtime detection: /proc/cpuinfo is all there is
        # a numpy that does not know AVX512FP16 confirms the rest: nothing is dropped
        (SAPPHIRE, "x86_64", {n: True for n in hardware.RUNTIME_NAMES.values() if n != "AVX512FP16"}, None, None),
        # qemu -cpu Haswell on a Sapphire Rapids host: the kernels see AVX2, so does bulkinfer
        (SAPPHIRE, "x86_64", HASWELL, ["avx2"],
         ["amx", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx512f"]),
        # an ARM sandbox whose /proc/cpuinfo is its host's: SVE and the dot product do not execute
        (GRAVITON, "aarch64", {"ASIMD": True, "ASIMDHP": True, "ASIMDDP": False, "SVE": False}, ["arm_fp16", "neon"],
         ["arm_bf16", "arm_dotprod", "i8mm", "sve"]),
    ],
)  # fmt: skip
def test_features_the_process_cannot_execute_are_not_the_machines(monkeypatch, text, arch, runtime, features,
                                                                   unconfirmed):  # fmt: skip
    parsed = hardware.parse_cpuinfo(text, arch)
    checked = hardware.confirm(parsed, runtime)
    assert checked["features"] == (parsed["features"] if features is None else features)
    assert checked.get("unconfirmed") == unconfirmed
    monkeypatch.setattr(hardware, "cpu", lambda: {**checked, "cpus": 2})
    if features == ["avx2"]:  # what follows from it: 7-bit int8 weights, bf16 and int8 warned, the cache key
        assert hardware.int8_scheme() == {"reduce_range": True} and hardware.isa_key() == "x86_64:avx2"
        assert hardware.emulated("cpu", "bf16") and hardware.emulation_warning("cpu", "int8") is not None


def test_this_machines_description_is_what_this_process_executes():
    """The real detection: every feature reported is one numpy's runtime detection confirms
    (or one it cannot check, when nothing it checks was refused)."""
    c = hardware.cpu()
    runtime = hardware._runtime_features()
    assert runtime is not None  # numpy 2 exposes it: the cross-check is live here
    for feature in c["features"]:
        if feature in hardware.RUNTIME_NAMES:
            assert runtime[hardware.RUNTIME_NAMES[feature]], feature


@pytest.mark.parametrize(
    ("text", "arch", "card", "providers", "expect"),
    [
        (AVX2, "x86_64", None, ["CPUExecutionProvider"], {
            ("cpu", "onnxruntime", "fp32"): "native", ("cpu", "openvino", "fp32"): "unavailable", ("cpu", "openvino", "int8"): "unavailable", ("cpu", "onnxruntime", "int8"): "weak kernels",
            ("cpu", "torch", "bf16"): "emulated", ("cpu", "torch", "fp16"): "emulated",
            ("cuda", "torch", "fp32/fp16/bf16"): "unavailable"}),
        (SAPPHIRE, "x86_64", T4, ["CUDAExecutionProvider", "CPUExecutionProvider"], {
            ("cpu", "onnxruntime", "fp32"): "native", ("cpu", "openvino", "fp32"): "unavailable", ("cpu", "openvino", "int8"): "unavailable", ("cpu", "onnxruntime", "int8"): "native",
            ("cpu", "torch", "bf16"): "native", ("cpu", "torch", "fp16"): "native",
            ("cuda", "torch", "fp32"): "native", ("cuda", "torch", "fp16"): "native",
            ("cuda", "torch", "bf16"): "emulated", ("cuda", "onnxruntime", "fp32"): "native",
            ("cuda", "onnxruntime + tensorrt", "fp32/fp16"): "unavailable"}),
        (GRAVITON, "aarch64", H100, ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"], {
            ("cpu", "onnxruntime", "fp32"): "native", ("cpu", "openvino", "fp32"): "unavailable", ("cpu", "openvino", "int8"): "unavailable", ("cpu", "onnxruntime", "int8"): "native",
            ("cpu", "torch", "bf16"): "native", ("cpu", "torch", "fp16"): "native",
            ("cuda", "torch", "fp32"): "native", ("cuda", "torch", "fp16"): "native",
            ("cuda", "torch", "bf16"): "native", ("cuda", "onnxruntime", "fp32"): "native",
            ("cuda", "onnxruntime + tensorrt", "fp32/fp16"): "native"}),
    ],
)  # fmt: skip
def test_the_survey_gives_each_engine_and_precision_its_verdict_per_machine_kind(
    monkeypatch, text, arch, card, providers, expect
):
    monkeypatch.setattr(hardware, "cpu", lambda: {**hardware.parse_cpuinfo(text, arch), "cpus": 4})
    monkeypatch.setattr(hardware, "gpu", lambda device: card if device.startswith("cuda") else None)
    found = hardware.survey("cuda", {"torch": "2.13.0", "onnxruntime_providers": providers})
    assert {(r["device"], r["engine"], r["precision"]): r["verdict"] for r in found["precisions"]} == expect
    assert found["isa"] == hardware.isa_key() and found["gpu"] == card
    for libraries, int8 in (({"openvino": "2026.4.1"}, "unavailable"), ({"openvino": "2026.4.1", "nncf": "3.4.0"},
                            found_int8 := expect[("cpu", "onnxruntime", "int8")])):  # fmt: skip
        with_openvino = hardware.survey("cuda", {"torch": "2.13.0", **libraries, "onnxruntime_providers": providers})
        rows = {
            r["precision"]: (r["verdict"], r["note"]) for r in with_openvino["precisions"] if r["engine"] == "openvino"
        }
        assert rows["fp32"] == ("native", "runtime.engine = openvino")
        # int8 needs nncf; its kernels are weak where ONNX Runtime's are (no VNNI)
        assert rows["int8"][0] == int8 and ("nncf" in rows["int8"][1]) == (int8 == "unavailable")
    assert found_int8 in ("native", "weak kernels")
    notes = {(r["device"], r["precision"]): r["note"] for r in found["precisions"] if r["engine"] != "openvino"}
    if text == AVX2:
        assert notes[("cpu", "int8")].startswith("no VNNI: 7-bit weights")
        assert notes[("cpu", "bf16")] == "no bf16 instructions: slower than fp32; use fp32 or int8"
    if card == T4:
        assert "use fp16" in notes[("cuda", "bf16")]
        tensorrt = next(r for r in found["precisions"] if "tensorrt" in r["engine"])
        assert (
            tensorrt["note"]
            == "this onnxruntime has no TensorrtExecutionProvider; pip install onnxruntime-gpu tensorrt"
        )


def _cgroups(root, lines: str, files: dict[str, str]):
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text(lines)
    for path, text in files.items():
        (root / "sys" / "fs" / "cgroup" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "sys" / "fs" / "cgroup" / path).write_text(text)
    return root


@pytest.mark.parametrize(
    ("lines", "files", "quota"),
    [
        # cgroup v2: the pod's limit on a parent, none on the container's own cgroup
        ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/pod1/c1/cpu.max": "max 100000\n"}, 1.5),
        ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0),  # inside a namespace: the container's cgroup is the root
        ("0::/a/b\n", {"a/cpu.max": "400000 100000\n", "a/b/cpu.max": "250000 100000\n"}, 2.5),  # the least
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),
        # cgroup v1
        ("4:cpu,cpuacct:/docker/x\n3:memory:/docker/x\n",
         {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"}, 3.0),
        ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
        ("1:cpu:/\n", {}, None),  # no files: no quota known
    ],
)  # fmt: skip
def test_the_cpu_quota_of_a_container_is_read_from_its_cgroups(tmp_path, lines, files, quota):
    assert hardware.cpu_quota(_cgroups(tmp_path, lines, files)) == quota


def test_threads_follow_the_quota_rounded_down_never_the_nodes_cores(monkeypatch):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda _pid: set(range(64)))
    for quota, cpus in ((None, 64), (2.0, 2), (1.5, 1), (0.5, 1), (128.0, 64)):
        monkeypatch.setattr(hardware, "cpu_quota", lambda q=quota: q)
        assert hardware.available_cpus() == cpus
