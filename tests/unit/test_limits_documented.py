"""docs/reliability.md#every-limit lists every config setting that bounds a size, count, time or
spend, and the test that shows it honoured or refused: a setting added without a row, or a row
naming a test that does not exist, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from bulkinfer.config import field_docs

ROOT = Path(__file__).resolve().parents[2]
LIMIT = re.compile(r"max|_bytes|_rows|requests|window|tokens|limit|_mb|pixels|maxlen|ttl")
NOT_LIMITS = {"model.price_per_million_tokens"}  # a price, not a bound


def _rows() -> list[tuple[list[str], str]]:
    page = (ROOT / "docs" / "reliability.md").read_text()
    table = page[page.index("## Every limit") :]
    rows = re.findall(r"^\| (`[^|]+`|a key's [^|]+) \| [^|]+ \| ([^|]+) \|$", table, re.M)
    return [(re.findall(r"`([\w.]+)`", names), test.strip()) for names, test in rows]


def test_every_limit_setting_has_a_row():
    listed = {name for names, _test in _rows() for name in names}
    limits = {name for name, _d, _doc in field_docs() if LIMIT.search(name.split(".", 1)[1]) and name not in NOT_LIMITS}
    assert sorted(limits - listed) == []


def test_every_row_names_a_test_that_exists():
    rows = _rows()
    assert len(rows) >= 30
    for names, test in rows:
        if test == "—":
            continue
        path, _, name = test.strip("`").partition("::")
        source = (ROOT / "tests" / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), (names, test)
