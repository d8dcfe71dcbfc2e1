"""Picture models against the packages' own answers on the same files: NudeNet's ``detect``
and RapidOCR's text; the generic heads of image-onnx against numpy on tiny models built here;
a Parquet column of bytes or paths; a custom ImageAdapter."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from bulkinfer import load_config, run_job
from bulkinfer.adapters.image import ImageAdapter

from helpers import read_output
from pictures import photo, text_page, write_bad, write_photos


def _run(tmp_path: Path, paths: list[str], name: str, **sections: dict) -> pa.Table:
    out = tmp_path / "out"
    data: dict = {**sections, "source": {"paths": paths, **sections.get("source", {})}}
    data["model"] = {"name": name, **sections.get("model", {})}
    cfg = load_config(None, {**data, "sink": {"path": str(out)}})
    result = run_job(cfg)
    assert result.status == "complete"
    key = sections.get("source", {}).get("id_column", "id")
    return read_output(out).sort_by(key)


def test_nudenet_equals_its_own_detect(tmp_path):
    from nudenet import NudeDetector

    names = write_photos(tmp_path / "photos", 8)
    table = _run(tmp_path, [str(tmp_path / "photos")], "nudenet", source={"format": "images"})
    assert table.column("id").to_pylist() == sorted(names)
    own = NudeDetector()
    for row in table.to_pylist():
        theirs = own.detect(str(tmp_path / "photos" / row["id"]))
        ours = row["detections"]
        assert [d["label"] for d in ours] == [d["class"] for d in theirs], row["id"]
        for a, b in zip(ours, theirs, strict=True):
            assert abs(a["score"] - b["score"]) <= 1e-3
            assert max(abs(x - y) for x, y in zip(a["box"], b["box"], strict=True)) <= 1
    astronaut = next(r for r in table.to_pylist() if "astronaut" in r["id"])
    assert "FACE_FEMALE" in {d["label"] for d in astronaut["detections"]}  # the face its own detect finds


def test_ocr_reads_the_drawn_words_as_rapidocr_does(tmp_path):
    from rapidocr_onnxruntime import RapidOCR

    pages = {"p0.png": ["Invoice 2041", "Total due 318.50"], "p1.png": ["batch inference"], "p2.png": ["hello world"]}
    (tmp_path / "pages").mkdir()
    for name, lines in pages.items():
        text_page(lines).save(tmp_path / "pages" / name)
    table = _run(tmp_path, [str(tmp_path / "pages" / "*.png")], "ocr")
    engine = RapidOCR()
    for row in table.to_pylist():
        result, _ = engine(str(tmp_path / "pages" / row["id"]))
        assert row["text"] == "\n".join(r[1] for r in result)  # RapidOCR's own text, identical
        assert [ln["box"] for ln in row["lines"]] == [[[float(x), float(y)] for x, y in r[0]] for r in result]
        drawn = "".join(pages[row["id"]]).replace(" ", "")
        assert row["text"].replace(" ", "").replace("\n", "") == drawn  # the drawn words, in order


def _conv_model(path: Path, head: str, classes: int = 4, seed: int = 0) -> np.ndarray:
    """A tiny random-weight model over 3x16x16 input: mean-pooled channels times a matrix."""
    rng = np.random.default_rng(seed)
    width = {"classify": classes, "embed": 6, "detect": (4 + classes) * 3}[head]
    w = rng.normal(size=(3, width)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["pooled"], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["y"]),
    ]
    out_shape: list = ["n", width]
    if head == "detect":
        nodes.append(helper.make_node("Reshape", ["y", "shape"], ["y2"]))
        nodes.append(helper.make_node("Abs", ["y2"], ["out"]))
        out_shape = ["n", 4 + classes, 3]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 16])],
        [helper.make_tensor_value_info("out" if head == "detect" else "y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "axes"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([-1, 4 + classes, 3], np.int64), "shape")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return w


def _pixels(image: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.resize(image, (16, 16), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255.0


def test_image_onnx_classify_and_embed_match_numpy(tmp_path):
    names = write_photos(tmp_path / "photos", 5, scale=0.25)
    w = _conv_model(tmp_path / "cls.onnx", "classify")
    (tmp_path / "labels.txt").write_text("cat\ndog\nboat\nsky\n")
    opts = {"head": "classify", "labels": str(tmp_path / "labels.txt"), "top_k": 2}
    table = _run(
        tmp_path,
        [str(tmp_path / "photos/*.jpg")],
        str(tmp_path / "cls.onnx"),
        model={"kind": "image-onnx", "options": opts},
    )
    for row, name in zip(table.to_pylist(), sorted(names), strict=True):
        rgb = np.asarray(Image.open(tmp_path / "photos" / name).convert("RGB"))
        logits = _pixels(rgb).mean(axis=(0, 1)) @ w
        p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        order = np.argsort(-p)
        assert row["label"] == ["cat", "dog", "boat", "sky"][order[0]]
        assert [x["score"] for x in row["labels"]] == pytest.approx([p[order[0]], p[order[1]]], abs=1e-5)
    _conv_model(tmp_path / "emb.onnx", "embed")
    shutil_out = tmp_path / "out"
    import shutil

    shutil.rmtree(shutil_out)
    emb = _run(
        tmp_path,
        [str(tmp_path / "photos/*.jpg")],
        str(tmp_path / "emb.onnx"),
        model={"kind": "image-onnx", "options": {"head": "embed"}},
    )
    assert emb.schema.field("embedding").type.list_size == 6


def test_image_onnx_detect_maps_boxes_to_the_original_pixels(tmp_path):
    from bulkinfer.adapters.image_onnx import detect_boxes

    out = np.zeros((4 + 2, 3), np.float32)
    out[:, 0] = [8, 8, 4, 4, 0.9, 0.1]  # centre (8, 8), 4x4, class 0 at 0.9
    out[:, 1] = [8.5, 8, 4, 4, 0.2, 0.8]  # overlaps the first: suppressed (class-agnostic)
    out[:, 2] = [2, 2, 2, 2, 0.1, 0.1]  # under the threshold
    found = detect_boxes(out, (64, 32, 4.0, 2.0), 0.25, 0.45, lambda i: "ab"[i])
    assert found == [{"label": "a", "score": pytest.approx(0.9), "box": [24, 12, 16, 8]}]


def test_parquet_bytes_and_path_columns(tmp_path):
    names = write_photos(tmp_path / "photos", 4)
    blobs = [(tmp_path / "photos" / n).read_bytes() for n in names]
    table = pa.table({"key": [f"k{i}" for i in range(4)], "image": pa.array(blobs, pa.binary()),
                      "where": [str(tmp_path / "photos" / n) for n in names]})  # fmt: skip
    pq.write_table(table, tmp_path / "pics.parquet")
    by_bytes = _run(tmp_path, [str(tmp_path / "pics.parquet")], "nudenet", source={"id_column": "key"})
    import shutil

    shutil.rmtree(tmp_path / "out")
    by_path = _run(
        tmp_path,
        [str(tmp_path / "pics.parquet")],
        "nudenet",
        source={"id_column": "key"},
        model={"image_column": "where"},
    )
    assert by_bytes.column("key").to_pylist() == [f"k{i}" for i in range(4)]
    assert by_bytes.column("detections").to_pylist() == by_path.column("detections").to_pylist()
    assert any(by_bytes.column("detections").to_pylist())


class MeanRed(ImageAdapter):
    def predict(self, images: list[np.ndarray]) -> dict:
        return {"red": [float(im[:, :, 0].mean()) for im in images], "height": [im.shape[0] for im in images]}


def test_custom_image_adapter_gets_decoded_rgb(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    folder = tmp_path / "p"
    folder.mkdir()
    Image.new("RGB", (7, 5), (200, 0, 0)).save(folder / "red.png")
    buf = io.BytesIO()
    Image.fromarray(photo("coffee")).save(buf, "PNG")
    (folder / "coffee.png").write_bytes(buf.getvalue())
    write_bad(folder)
    more = write_photos(folder, 4, scale=0.2)
    table = _run(
        tmp_path, [str(folder)], "test_vision_models:MeanRed", source={"format": "images"}, execution={"max_errors": 3}
    )
    rows = {r["id"]: r for r in table.to_pylist()}
    assert set(rows) == {"red.png", "coffee.png", *more}
    assert rows["red.png"]["red"] == 200.0 and rows["red.png"]["height"] == 5
    errors = [line for f in (tmp_path / "out" / "_errors").iterdir() for line in f.read_text().splitlines()]
    assert sorted(json.loads(e)["id"] for e in errors) == ["empty.jpg", "text.jpg", "truncated.jpg"]


def test_bf16_on_openvino_is_gated_on_the_jobs_boxes(tmp_path):
    from bulkinfer.core.hardware import emulated

    if emulated("cpu", "bf16"):
        pytest.skip("this CPU has no bf16 instructions: bf16 is refused here (test_bf16_refusals covers it)")
    names = write_photos(tmp_path / "photos", 16, scale=0.5)
    runtime = {"precision": "bf16", "engine": "openvino", "quality_sample_rows": 16}
    table = _run(tmp_path, [str(tmp_path / "photos/*.jpg")], "nudenet", runtime=runtime)
    assert table.column("id").to_pylist() == sorted(names)
    quality = json.loads((tmp_path / "out" / "_bulkinfer" / "quality.json").read_text())
    assert quality["precision"] == "bf16" and quality["rows"] == 16 and quality["passed"]
    assert quality["boxes_matched"] >= 0.99 and quality["boxes_fp32"] > 0


def test_bf16_refusals(tmp_path):
    from bulkinfer.core.errors import ConfigError

    write_photos(tmp_path / "photos", 1, scale=0.2)
    with pytest.raises(ConfigError, match="picture models run bf16 on openvino"):
        _run(
            tmp_path,
            [str(tmp_path / "photos/*.jpg")],
            "nudenet",
            runtime={"precision": "bf16", "engine": "onnxruntime"},
        )
    with pytest.raises(ConfigError, match="int8 is not built for picture model 'nudenet'"):
        _run(tmp_path, [str(tmp_path / "photos/*.jpg")], "nudenet", runtime={"precision": "int8"})
    with pytest.raises(ConfigError, match="runtime.device = cuda: picture models run on the CPU"):
        _run(tmp_path, [str(tmp_path / "photos/*.jpg")], "nudenet", runtime={"device": "cuda"})
    with pytest.raises(ConfigError, match="bf16 is not built for picture model 'ocr'; use fp32"):
        _run(tmp_path, [str(tmp_path / "photos/*.jpg")], "ocr", runtime={"precision": "bf16"})


def test_reduced_decode_is_gated_against_the_exact_decode(tmp_path):
    from bulkinfer.core.errors import QualityGateError

    write_photos(tmp_path / "photos", 16, scale=1.5)
    source = {"decode": "reduced"}
    with pytest.raises(QualityGateError, match='boxes_matched .*use source.decode = "exact"'):
        _run(tmp_path, [str(tmp_path / "photos/*.jpg")], "nudenet", source=source, runtime={"quality_sample_rows": 16})
    figures = json.loads((tmp_path / "out" / "_bulkinfer" / "quality.json").read_text()) if (
        tmp_path / "out" / "_bulkinfer" / "quality.json").exists() else None  # fmt: skip
    assert figures is None or not figures["passed"]
    # a floor the job accepts: it runs, its figures kept, each picture once
    import shutil

    shutil.rmtree(tmp_path / "out")
    table = _run(tmp_path, [str(tmp_path / "photos/*.jpg")], "nudenet", source=source,
                 runtime={"quality_sample_rows": 16, "quality_floor": 0.0})  # fmt: skip
    assert table.num_rows == 16
    quality = json.loads((tmp_path / "out" / "_bulkinfer" / "quality.json").read_text())
    assert quality["precision"] == "fp32 with reduced decode" and quality["passed"] and quality["boxes_fp32"] > 0


def test_reduction_keeps_the_model_size_and_maps_boxes_back(tmp_path):
    from bulkinfer.adapters.image_onnx import ImageOnnxAdapter, VisionOptions, detect_boxes

    _conv_model(tmp_path / "m.onnx", "detect")
    letterbox = ImageOnnxAdapter(tmp_path / "m.onnx", VisionOptions(head="detect", resize="letterbox", size=320))
    assert [letterbox.factor(w, h) for w, h in ((1650, 1100), (2600, 400), (700, 500), (300, 200))] == [4, 8, 2, 1]
    stretch = ImageOnnxAdapter(tmp_path / "m.onnx", VisionOptions(head="detect", resize="stretch", size=320))
    assert [stretch.factor(w, h) for w, h in ((1650, 1100), (2600, 400))] == [2, 1]
    image = np.zeros((275, 413, 3), np.uint8)  # 1650 x 1100 decoded at 1/4 (libjpeg rounds up)
    _tensor, meta = letterbox.rescale(letterbox.prepare(image), (1650, 1100), (413, 275))
    assert meta[:2] == (1650, 1100) and meta[2] == pytest.approx(413 / 320 * 1650 / 413)
    out = np.zeros((4 + 2, 1), np.float32)
    out[:, 0] = [160, 80, 32, 32, 0.9, 0.0]  # a box around (160, 80) on the 320 input
    (found,) = detect_boxes(out, meta, 0.25, 0.45, str)
    assert found["box"] == [
        int((160 - 16) * 1650 / 320),
        int((80 - 16) * 1650 / 320),
        int(32 * 1650 / 320),
        int(32 * 1650 / 320),
    ]
