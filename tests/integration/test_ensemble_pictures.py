"""The moderation pipeline of the issue in one job: NudeNet, RapidOCR and a text classifier over
the OCR text, on photos and drawn pages; each picture read and decoded once for both picture
models (counted), every model's columns written, equal to the single-model job's; ``serve``
answers an upload of the same pictures with the same columns."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from bulkinfer import ConfigError, load_config, run_job

from helpers import Server, fresh_module, read_output
from pictures import TOXIC_CLASSIFIER, text_page, write_photos

pytest.importorskip("nudenet", reason="the picture models come with bulkinfer[images]")

DOC = Path(__file__).resolve().parents[2] / "docs" / "ensembles.md"
EXAMPLE = re.compile(r"<!-- ensemble-example -->\n```toml\n(.*?)```", re.S)
PAGES = {"page-0.png": ["hello world"], "page-1.png": ["I hate spam", "kill it"]}


def test_three_models_decode_each_picture_once_and_write_every_models_columns(tmp_path, monkeypatch):
    module = fresh_module(tmp_path, monkeypatch, "toxic_text", TOXIC_CLASSIFIER)
    photos = write_photos(tmp_path / "pics", 4, scale=0.5)
    for name, lines in PAGES.items():
        text_page(lines).save(tmp_path / "pics" / name)
    (tmp_path / "job.toml").write_text(EXAMPLE.search(DOC.read_text()).group(1).replace("toxic_text", module))
    monkeypatch.chdir(tmp_path)
    report = run_job(load_config("job.toml", overrides={"execution.progress": "none"})).report
    rows = len(photos) + len(PAGES)
    assert report["pictures_decoded"] == rows  # not once per picture model
    assert {n: m["rows"] for n, m in report["models"].items()} == {"nudenet": rows, "ocr": rows, "text": rows}
    out = {r["id"]: r for r in read_output(tmp_path / "out").to_pylist()}
    assert out["page-1.png"]["ocr.text"] == "I hate spam\nkill it" and out["page-1.png"]["text.toxic"] == 1.0
    assert {i: r["decision"] for i, r in out.items()} == {**dict.fromkeys(photos, "publish"),
                                                           "page-0.png": "publish", "page-1.png": "review"}  # fmt: skip
    assert {c for c in out["page-0.png"] if c.endswith(".error")} == {"nudenet.error", "ocr.error", "text.error"}
    alone = run_job(load_config(overrides={"source.paths": ["pics"], "source.format": "images", "model.name": "nudenet",
                                           "sink.path": "alone", "execution.progress": "none"}))  # fmt: skip
    assert alone.report["pictures_decoded"] == rows
    single = {r["id"]: r["detections"] for r in read_output(tmp_path / "alone").to_pylist()}
    assert single == {i: r["nudenet.detections"] for i, r in out.items()}
    assert any(single.values())  # the photos have faces NudeNet finds
    served = served_rows(tmp_path, ["page-1.png", photos[0]])
    assert served == {i: {k: v for k, v in out[i].items() if k in served[i]} for i in served}
    assert set(served["page-1.png"]) >= {"nudenet.detections", "ocr.text", "text.toxic", "decision"}
    typo = load_config("job.toml", overrides={"models.text.text_column": "ocr.txt", "sink.path": "typo"})
    with pytest.raises(ConfigError, match=r"^models\.text: reads 'ocr\.txt', which model 'ocr' does not write "
                                          r"\(it writes ocr\.lines, ocr\.text\)$"):  # fmt: skip
        run_job(typo)


def served_rows(root: Path, names: list[str]) -> dict[str, dict]:
    """``serve job.toml``'s answer to the pictures as one multipart upload, by id."""
    server = Server(["job.toml"], root)
    try:
        files = [("image", (n, (root / "pics" / n).read_bytes())) for n in names]
        answer = httpx.post(f"{server.url}/v1/predict", files=files, timeout=120)
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    rows = answer.json()["rows"]
    assert [r["id"] for r in rows] == names
    return {r["id"]: r for r in rows}
