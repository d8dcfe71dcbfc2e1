"""Decoding pictures: every colour mode to 8-bit RGB, EXIF orientation applied, the pixel limit,
the budget on decoded bytes in flight, and each broken file named in one error."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
from PIL import Image

from bulkinfer.adapters.decode import BadImage, DecodeBudget, DecodePool, decode_rgb, open_image


def _encoded(img: Image.Image, fmt: str = "PNG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _decode(data: bytes, max_pixels: int | None = None) -> np.ndarray:
    return decode_rgb(open_image(data, "pic", max_pixels), "pic")


@pytest.mark.parametrize(
    ("mode", "value", "expected"),
    [
        ("L", 77, (77, 77, 77)),
        ("1", 1, (255, 255, 255)),
        ("RGBA", (10, 20, 30, 0), (10, 20, 30)),  # the colour under the alpha is kept
        ("LA", (90, 128), (90, 90, 90)),
        ("CMYK", (0, 255, 255, 0), (255, 0, 0)),
        ("I;16", 0x4D00, (0x4D, 0x4D, 0x4D)),  # scaled to 8 bits, not clipped to 255
    ],
)
def test_every_mode_becomes_8bit_rgb(mode, value, expected):
    fmt = "TIFF" if mode == "CMYK" else "PNG"
    out = _decode(_encoded(Image.new(mode, (5, 4), value), fmt))
    assert out.shape == (4, 5, 3) and out.dtype == np.uint8
    assert tuple(int(v) for v in out[2, 3]) == expected


def test_palette_and_gif_first_frame():
    frames = [Image.new("P", (6, 6), i) for i in (3, 9)]
    for f in frames:
        f.putpalette([0, 0, 0] * 3 + [200, 10, 10] + [0, 0, 0] * 5 + [10, 200, 10] + [0, 0, 0] * 246)
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert tuple(int(v) for v in _decode(buf.getvalue())[0, 0]) == (200, 10, 10)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (8, 4), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 2, 4))  # a white left edge
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    out = _decode(_encoded(img, "JPEG", exif=exif, quality=95))
    assert out.shape == (8, 4, 3)  # upright: taller than wide
    assert out[:2, :, 0].mean() > 200 and out[-2:, :, 0].mean() < 50  # the left edge is now the top


def test_over_the_pixel_limit_is_refused_before_decoding():
    data = _encoded(Image.new("L", (300, 200)))
    with pytest.raises(BadImage, match=r"pic: 300x200 = 60000 pixels, over source.max_image_pixels \(59999\)"):
        _decode(data, max_pixels=59_999)
    assert _decode(data, max_pixels=60_000).shape == (200, 300, 3)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "pic: the file is empty"),
        (b"hello, I am text", "pic: not a picture Pillow can read"),
        (None, "pic: cannot decode the picture"),  # a truncated JPEG
    ],
)
def test_broken_files_are_one_named_error(data, message):
    if data is None:
        whole = _encoded(Image.new("RGB", (64, 64), (1, 2, 3)), "JPEG")
        data = whole[: len(whole) // 2]
    with pytest.raises(BadImage, match=message):
        _decode(data)


def test_a_jpeg_cut_short_is_refused_not_padded():
    whole = _encoded(Image.fromarray(np.random.default_rng(0).integers(0, 255, (256, 256, 3), np.uint8)), "JPEG")
    assert _decode(whole).shape == (256, 256, 3)  # the fast path (OpenCV) takes the whole file
    with pytest.raises(BadImage, match="pic: cannot decode the picture .*truncated"):
        _decode(whole[: int(len(whole) * 0.8)])


def test_jpeg_decodes_as_pillow_does():
    data = _encoded(Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 80, 3), np.uint8)), "JPEG")
    fast = _decode(data)
    exact = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.abs(fast.astype(int) - exact.astype(int)).max() <= 1


def test_pool_keeps_order_and_names_each_bad_row():
    good = [_encoded(Image.new("L", (4, 4), v)) for v in (10, 20, 30)]
    pool = DecodePool(2, None, 1 << 20)
    out = pool.run([good[0], b"", good[1], b"junk", good[2]], list("abcde"), lambda im: int(im[0, 0, 0]))
    pool.close()
    assert out[0] == 10 and out[2] == 20 and out[4] == 30
    assert [str(out[i]).split(":")[0] for i in (1, 3)] == ["b", "d"]
    assert all(isinstance(out[i], BadImage) for i in (1, 3))


def test_budget_holds_in_flight_bytes_under_its_limit():
    budget = DecodeBudget(100)
    held = []

    def work(n: int) -> None:
        budget.take(n)
        held.append(budget.used)
        time.sleep(0.01)
        budget.give(n)

    threads = [threading.Thread(target=work, args=(n,)) for n in (60, 30, 50, 40, 70, 150)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.used == 0
    assert max(held) <= 150 and all(h <= 100 for h in held if h != 150)  # 150 > the whole budget: alone
    assert budget.peak <= 150
