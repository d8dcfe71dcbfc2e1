"""The ONNX export of a BERT encoder is fused (Attention, EmbedLayerNormalization, ...) when the
fused graph gives the plain graph's output, and int8 quantizes the fused Attention (QAttention)
within the partial-int8 blocks; other models and left-padding tokenizers keep the plain graph.
On a tiny random-weight BERT in sentence-transformers layout (MiniLM's tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bulkinfer.engines.int8 import layer_groups
from bulkinfer.engines.ort_engine import OrtEngine, _export, _fusable, _fuse

from helpers import tiny_st_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_path) -> Path:
    return tiny_st_model(tmp_path_factory.mktemp("fused") / "tiny", minilm_path)


def _engine(model: Path, cache: Path, precision: str, keep: tuple[str, ...] = ()) -> OrtEngine:
    return OrtEngine(
        str(model), device="cpu", threads=1, precision=precision, model_digest=model.name, cache_dir=cache,
        keep_fp32=keep,
    )  # fmt: skip


def _ops(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _rows(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 40, n)
    ids = np.zeros((n, int(lengths.max())), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, k in enumerate(lengths):
        ids[row, :k], mask[row, :k] = rng.integers(1000, 30000, k), 1
    return ids, mask


def test_a_bert_is_fused_and_int8_quantizes_its_attention_within_the_blocks(tiny, tmp_path):
    import torch
    from transformers import AutoModel

    fp32 = _engine(tiny, tmp_path, "fp32")
    meta = json.loads((fp32.path.parent / "meta.json").read_text())
    assert meta["fused"]["Attention"] == 2 and meta["fused"]["EmbedLayerNormalization"] == 1
    ops = _ops(fp32.path)
    assert ops["Attention"] == 2 and ops["MatMul"] == 6  # 3 a layer: attention output, intermediate, output
    # the fused graph gives torch's output on every real token of right-padded rows
    ids, mask = _rows()
    got = fp32.forward(ids, mask)
    with torch.inference_mode():
        want = (
            AutoModel.from_pretrained(str(tiny))
            .eval()(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            .last_hidden_state.numpy()
        )
    real = mask.astype(bool)
    assert np.abs(got[real] - want[real]).max() <= 1e-3 * np.abs(want[real]).max()
    # each fused Attention goes with its layer's attention block
    groups = layer_groups(fp32.path)
    assert groups["layer.0/attention"][0] == "Attention_0" and len(groups["layer.0/attention"]) == 2
    assert sorted(groups) == [f"layer.{i}/{b}" for i in (0, 1) for b in ("attention", "intermediate", "output")]
    # int8: QAttention in both layers; keeping layer.0/attention in fp32 keeps its Attention too
    int8 = _engine(tiny, tmp_path, "int8")
    assert _ops(int8.path).get("QAttention") == 2
    assert json.loads((int8.path.parent / "meta.json").read_text())["fused"] == meta["fused"]
    part = _ops(_engine(tiny, tmp_path, "int8", ("layer.0/attention",)).path)
    assert part.get("QAttention") == 1 and part.get("Attention") == 1


def test_left_padding_tokenizers_and_other_models_keep_the_plain_graph(tiny, tmp_path):
    assert _fusable(str(tiny)) == {"num_heads": 2, "hidden_size": 32, "vocab_size": 30522}
    left = tmp_path / "left"
    shutil.copytree(tiny, left)
    tok = json.loads((left / "tokenizer_config.json").read_text())
    (left / "tokenizer_config.json").write_text(json.dumps({**tok, "padding_side": "left"}))
    assert _fusable(str(left)) is None
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "roberta"}))
    assert _fusable(str(other)) is None
    engine = _engine(left, tmp_path / "cache", "fp32")
    assert "fused" not in json.loads((engine.path.parent / "meta.json").read_text())
    assert "Attention" not in _ops(engine.path) and _ops(engine.path)["MatMul"] >= 12


def test_a_fused_graph_that_differs_from_the_plain_one_is_not_kept(tiny, tmp_path, monkeypatch):
    import bulkinfer.engines.ort_engine as ort_engine

    shape = _fusable(str(tiny))
    assert shape is not None
    raw = tmp_path / "raw.onnx"
    _export(str(tiny), raw, eager=True)
    assert _fuse(raw, tmp_path / "right.onnx", shape)["Attention"] == 2  # type: ignore[index]
    # a probe padded on the left: the fused attention reads the mask as a length per row, so its
    # output differs from the plain graph's there; the guard must refuse it and write nothing
    right = ort_engine._probe(shape["vocab_size"])
    left = {k: np.ascontiguousarray(v[:, ::-1]) for k, v in right.items()}
    monkeypatch.setattr(ort_engine, "_probe", lambda vocab: left)
    assert _fuse(raw, tmp_path / "wrong.onnx", shape) is None
    assert not (tmp_path / "wrong.onnx").exists()
