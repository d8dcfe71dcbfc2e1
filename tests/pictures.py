"""Pictures the tests make: skimage's photos as JPEGs, text pages drawn with DejaVu Sans, and
the bad files a picture job must survive (named for what is wrong with them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

TOXIC_CLASSIFIER = '''
from bulkinfer.adapters import Adapter

WORDS = ("hate", "kill", "spam")


class Toxic(Adapter):
    output_columns = ("toxic",)

    def predict(self, batch):
        texts = batch.column(0).to_pylist()
        return {"toxic": [min(1.0, sum(t.lower().count(w) for w in WORDS) / 2) for t in texts]}
'''
"""A text classifier over OCR text (module source): the picture ensemble's test and bench write it."""

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "cat", "camera", "hubble_deep_field", "immunohistochemistry")


def photo(name: str) -> np.ndarray:
    import skimage.data

    image = np.asarray(getattr(skimage.data, name)())
    return np.repeat(image[:, :, None], 3, axis=2) if image.ndim == 2 else image[:, :, :3]


def write_photos(folder: Path, n: int, *, scale: float = 1.0, quality: int = 90) -> list[str]:
    """``n`` JPEGs (skimage's photos in turn, each copy resized a little differently): their names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        base = Image.fromarray(photo(PHOTOS[i % len(PHOTOS)]))
        w, h = base.size
        k = scale * (1 + 0.05 * (i // len(PHOTOS)))
        name = f"{i:04d}-{PHOTOS[i % len(PHOTOS)]}.jpg"
        base.resize((int(w * k), int(h * k))).save(folder / name, quality=quality)
        names.append(name)
    return names


def write_bad(folder: Path) -> dict[str, str]:
    """The bad pictures of the issue, each a file: name -> what the error must say."""
    folder.mkdir(parents=True, exist_ok=True)
    good = folder / "_good.jpg"
    Image.fromarray(photo("coffee")).save(good, quality=90)
    data = good.read_bytes()
    good.unlink()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 3])
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("this is not a picture\n")
    return {"truncated.jpg": "truncated", "empty.jpg": "empty", "text.jpg": "not a picture"}


def text_page(lines: list[str], size: int = 40) -> Image.Image:
    font = ImageFont.truetype(FONT, size)
    page = Image.new("RGB", (60 + size * max(len(x) for x in lines), 80 + int(size * 1.8) * len(lines)), "white")
    draw = ImageDraw.Draw(page)
    for j, line in enumerate(lines):
        draw.text((40, 40 + int(size * 1.8) * j), line, fill="black", font=font)
    return page


def write_webdataset(path: Path, keys: list[str], photos_dir: Path, *, missing_image: str | None = None) -> None:
    """A WebDataset tar as img2dataset writes it: ``key.jpg``, ``key.json``, ``key.txt`` per key
    (``missing_image``: a key with its sidecars but no picture)."""
    import io
    import json
    import tarfile

    def add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))

    names = sorted(p.name for p in photos_dir.glob("*.jpg"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for i, key in enumerate(keys):
            if key != missing_image:
                add(tf, f"{key}.jpg", (photos_dir / names[i % len(names)]).read_bytes())
            add(tf, f"{key}.json", json.dumps({"url": f"https://example.com/{key}", "width": 100 + i}).encode())
            add(tf, f"{key}.txt", f"caption {i}".encode())


def write_video(path: Path, seconds: float, rate: int = 10, size: tuple[int, int] = (160, 120), gop: int = 12) -> None:
    """A video encoded with PyAV (H.264) from drawn frames: frame i shows its number, so a
    frame read back can be told from its neighbours by its pixels (``frame_number``)."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    w, h = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.gop_size = gop
        for i in range(int(seconds * rate)):
            for packet in stream.encode(av.VideoFrame.from_ndarray(numbered_frame(i, w, h), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def numbered_frame(i: int, w: int, h: int) -> np.ndarray:
    """Frame ``i``: a bright band at a column that moves 4 pixels a frame."""
    frame = np.full((h, w, 3), 20, np.uint8)
    x = (i * 4) % (w - 8)
    frame[:, x : x + 8] = 235
    return frame


def frame_number(rgb: np.ndarray, w: int) -> int:
    """Which :func:`numbered_frame` ``rgb`` is (modulo its band's period)."""
    return int(np.argmax(rgb[:, :, 0].mean(axis=0) > 128) // 4)


def write_audio_only(path: Path) -> None:
    """A Matroska file with one audio stream and no video."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000, layout="mono")
        for i in range(4):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 2000), np.int16), format="s16", layout="mono")
            frame.sample_rate, frame.pts = 8000, i * 2000
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
