"""ONNX Runtime on a GPU: a provider this onnxruntime lacks, or one that fell back at load, is
refused in one line before anything is built or run; TensorRT gets one optimization profile and
its engine cache inside the compile cache, and the plain (unfused) graph. What can run without a
GPU runs here; the GPU itself is bench/gpu/check.py's."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from bulkinfer.config import load_config
from bulkinfer.core.errors import ConfigError, ModelError
from bulkinfer.engines.ort_engine import OrtEngine, build_entry, cache_entry, started, tensorrt_options


@pytest.mark.parametrize(("tensorrt", "precision"), [((256, 128), "fp16"), (None, "fp32")])
def test_a_gpu_provider_this_onnxruntime_lacks_is_refused_before_anything_is_built(tiny, tmp_path, tensorrt, precision):
    wanted = "TensorrtExecutionProvider" if tensorrt else "CUDAExecutionProvider"
    if wanted in ort.get_available_providers():
        pytest.skip(f"this onnxruntime has {wanted}")
    with pytest.raises(ModelError) as err:
        OrtEngine(str(tiny), device="cuda:0", threads=1, precision=precision, model_digest="d", cache_dir=tmp_path,
                  tensorrt=tensorrt)  # fmt: skip
    msg = str(err.value)
    assert (
        "\n" not in msg
        and f"has no {'TensorRT' if tensorrt else 'CUDA'} provider (" in msg
        and "pip install onnxruntime-gpu" in msg
    )
    assert ("runtime.tensorrt = false" in msg) == bool(tensorrt)
    assert not any(tmp_path.iterdir())  # nothing exported


def test_a_session_that_fell_back_from_the_provider_asked_for_is_refused(tiny, tmp_path):
    import warnings

    started(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
            "TensorrtExecutionProvider", "cuda")  # fmt: skip
    started(["CUDAExecutionProvider", "CPUExecutionProvider"], "CUDAExecutionProvider", "cuda:1")
    with pytest.raises(ModelError) as err:
        started(["CUDAExecutionProvider", "CPUExecutionProvider"], "TensorrtExecutionProvider", "cuda")
    msg = str(err.value)
    assert "could not start TensorrtExecutionProvider" in msg and "fell back to CUDAExecutionProvider" in msg
    assert "pip install tensorrt" in msg and "runtime.tensorrt = false" in msg
    # a real fallback: asked for CUDA where onnxruntime cannot run it, it only warns and runs on the CPU
    entry = cache_entry(tmp_path, "d", "fp32")
    build_entry(str(tiny), "fp32", entry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = ort.InferenceSession(
            str(entry / "model.onnx"), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    if "CUDAExecutionProvider" not in session.get_providers():
        with pytest.raises(ModelError, match="fell back to CPUExecutionProvider.*runtime.engine = torch"):
            started(session.get_providers(), "CUDAExecutionProvider", "cuda")


def test_tensorrt_gets_one_profile_up_to_the_batch_and_its_engines_in_the_compile_cache(tmp_path):
    engines = tmp_path / "entry" / "tensorrt" / "fp16-256x512"
    assert tensorrt_options(engines, "fp16", 1, 256, 512) == {
        "device_id": 1,
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(engines),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(engines),
        "trt_profile_min_shapes": "input_ids:1x1,attention_mask:1x1",
        "trt_profile_opt_shapes": "input_ids:256x128,attention_mask:256x128",
        "trt_profile_max_shapes": "input_ids:256x512,attention_mask:256x512",
    }
    fp32 = tensorrt_options(engines, "fp32", 0, 32, 64)
    assert fp32["trt_fp16_enable"] is False and fp32["trt_profile_opt_shapes"] == "input_ids:32x64,attention_mask:32x64"


def test_the_tensorrt_graph_is_the_plain_export_in_its_own_entry_and_gives_the_fused_ones_output(tiny, tmp_path):
    """TensorRT runs no onnxruntime contrib operators (the fused Attention would fall back to
    CUDA kernels, one subgraph per layer): its entry holds the unfused graph."""
    import onnx

    plain, fused = cache_entry(tmp_path, "d", "fp32", fuse=False), cache_entry(tmp_path, "d", "fp32")
    assert plain != fused
    build_entry(str(tiny), "fp32", plain, fuse=False)
    build_entry(str(tiny), "fp32", fused)
    assert "fused" not in json.loads((plain / "meta.json").read_text())
    assert json.loads((fused / "meta.json").read_text())["fused"]["Attention"] == 2
    ops = {node.op_type for node in onnx.load(str(plain / "model.onnx")).graph.node}
    assert not ops & {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"}
    ids = np.array([[101, 2000, 3000, 4000, 102], [101, 2500, 102, 0, 0]], dtype=np.int64)
    mask = (ids > 0).astype(np.int64)
    a, b = (ort.InferenceSession(str(e / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids, "attention_mask": mask})[0] for e in (plain, fused))  # fmt: skip
    real = mask.astype(bool)
    assert np.abs(a[real] - b[real]).max() <= 1e-4 * np.abs(a[real]).max()


def test_tune_refuses_a_tensorrt_job_in_one_line():
    from bulkinfer.precision.tune import tune

    cfg = load_config(sets=["runtime.tensorrt=true", "runtime.device=cuda", "runtime.precision=fp16"])
    with pytest.raises(ConfigError, match=r"^runtime.tensorrt: bulkinfer tune measures torch and onnxruntime"):
        tune(cfg)
