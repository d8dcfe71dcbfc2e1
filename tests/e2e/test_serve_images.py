"""`serve` answers a picture (a multipart upload, or base64 in JSON) with exactly what `run`
writes for the same bytes; a picture over serve.max_image_bytes is a 413 naming it, one over
source.max_image_pixels a 400 naming it, and a broken one a 400 naming what is wrong."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import Image

from helpers import Server, cli, read_output
from pictures import write_photos


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-pictures")
    names = write_photos(root / "photos", 4, scale=0.6)
    run = cli("run", "--input", "photos/*.jpg", "--model", "nudenet", "--output", "out", cwd=root)
    assert run.returncode == 0, run.stderr
    offline = {r["id"]: r["detections"] for r in read_output(root / "out").to_pylist()}
    args = ["--model", "nudenet", "--set", "serve.max_image_bytes=400000", "--set", "source.max_image_pixels=3000000"]
    server = Server(args, root)
    yield root, names, offline, server
    server.stop()


def test_upload_and_base64_answer_as_run_does(served):
    root, names, offline, server = served
    files = [("image", (n, (root / "photos" / n).read_bytes(), "image/jpeg")) for n in names[:3]]
    answer = httpx.post(f"{server.url}/v1/predict", files=files, timeout=60)
    assert answer.status_code == 200, answer.text
    rows = answer.json()["rows"]
    assert [r["id"] for r in rows] == names[:3]
    assert {r["id"]: r["detections"] for r in rows} == {n: offline[n] for n in names[:3]}
    assert any(offline[n] for n in names[:3])  # the astronaut's face at least: a comparison of something
    body = {"rows": [{"id": n, "image": base64.b64encode((root / "photos" / n).read_bytes()).decode()} for n in names]}
    answer = httpx.post(f"{server.url}/v1/predict", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert {r["id"]: r["detections"] for r in answer.json()["rows"]} == offline


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (w, h), 9).save(buf, "PNG")
    return buf.getvalue()


def test_limits_and_broken_pictures_are_named(served):
    _root, _names, _offline, server = served
    big = httpx.post(f"{server.url}/v1/predict", files=[("image", ("big.bin", b"\0" * 400_001))], timeout=60)
    assert big.status_code == 413 and "over serve.max_image_bytes=400000" in big.json()["error"]["message"]
    wide = httpx.post(f"{server.url}/v1/predict", files=[("image", ("wide.png", _png(3000, 1001)))], timeout=60)
    assert wide.status_code == 400, wide.text
    assert (
        "wide.png: 3000x1001 = 3003000 pixels, over source.max_image_pixels (3000000)"
        in wide.json()["error"]["message"]
    )
    junk = httpx.post(
        f"{server.url}/v1/predict", json={"rows": [{"id": "j", "image": base64.b64encode(b"junk").decode()}]}
    )
    assert junk.status_code == 400 and "j: not a picture Pillow can read" in junk.json()["error"]["message"]
    notb64 = httpx.post(f"{server.url}/v1/predict", json={"rows": [{"image": "%%%"}]})
    assert notb64.status_code == 422 and "rows[0].image: not valid base64" in notb64.json()["error"]["message"]
