"""Generate a synthetic product catalog (id, title, description, price, category) as Parquet.

Usage: python examples/make_catalog.py OUT.parquet [ROWS] [SEED]
Descriptions are 5..160 words, so length sorting and padding matter as in real catalogs.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_WORDS_TEXT = (
    "wireless bluetooth headphones noise cancelling over ear stainless steel water bottle insulated "
    "kids toy building blocks creative set organic cotton t-shirt slim fit running shoes breathable "
    "mesh lightweight ceramic coffee mug dishwasher safe laptop backpack anti theft usb charging "
    "port smart watch heart rate monitor fitness tracker waterproof kitchen knife set german steel "
    "led desk lamp dimmable eye care yoga mat non slip extra thick portable charger fast charging "
    "power bank"
)
WORDS = _WORDS_TEXT.split()
CATEGORIES = ["electronics", "home", "kitchen", "sports", "toys", "beauty", "garden", "fashion"]


def make_catalog(rows: int, seed: int = 7) -> pa.Table:
    """A deterministic catalog of ``rows`` rows."""
    rng = random.Random(seed)
    descs, titles, prices, cats = [], [], [], []
    for _ in range(rows):
        titles.append(" ".join(rng.choices(WORDS, k=rng.randint(3, 12))).title())
        k = int(min(160, max(5, rng.lognormvariate(3.3, 0.7))))
        descs.append(" ".join(rng.choices(WORDS, k=k)) + ".")
        prices.append(round(rng.uniform(1, 500), 2))
        cats.append(rng.choice(CATEGORIES))
    return pa.table({"id": list(range(rows)), "title": titles, "description": descs, "price": prices, "category": cats})


if __name__ == "__main__":
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(make_catalog(n, seed), out, row_group_size=4096)
    print(f"wrote {n} rows to {out}")
