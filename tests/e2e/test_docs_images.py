"""docs/images.md's examples run: the custom picture model as written there, over pictures
made here, through the CLI."""

from __future__ import annotations

import re
from pathlib import Path

from PIL import Image

from helpers import cli, read_output

PAGE = Path(__file__).resolve().parents[2] / "docs" / "images.md"


def test_the_custom_picture_model_example_runs(tmp_path):
    found = re.search(r"<!-- images-test: (\S+) -->\n```python\n(.*?)```", PAGE.read_text(), re.S)
    assert found, "docs/images.md lost its custom picture model example"
    (tmp_path / found.group(1)).write_text(found.group(2))
    (tmp_path / "pics").mkdir()
    for name, grey in (("dark.png", 10), ("light.png", 240)):
        Image.new("L", (8, 6), grey).save(tmp_path / "pics" / name)
    cli("run", "--input", "pics/*.png", "--model", "brightness:Brightness", "--output", "out", cwd=tmp_path, check=True)
    rows = {r["id"]: r["brightness"] for r in read_output(tmp_path / "out").to_pylist()}
    assert rows == {"dark.png": 10.0, "light.png": 240.0}
