"""Incremental runs and dedupe, each against a full run of the same job, one run.

Usage: .venv/bin/python bench/bench_incremental.py [ROWS]

- incremental: the bundled model over a ROWS-row catalog (yesterday's output, with input
  hashes), then today's catalog (5% of descriptions changed, 1% of rows deleted, rows
  shuffled): a full run of today's catalog vs ``--incremental-from`` yesterday's output.
  Prints the time ratio (target: incremental <= 12% of full) and checks that both outputs
  hold the same ids and the same vectors.
- dedupe: a ROWS-row catalog where 30% of the rows repeat another row's description:
  ``runtime.dedupe = true`` vs false (target >= 1.35x rows/s), outputs compared.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from machine import describe  # noqa: E402


def run(inp: Path, out: Path, **extra: object) -> float:
    from bulkinfer import load_config, run_job

    cfg = load_config(
        overrides={
            "source.paths": [str(inp)],
            "model.name": "minilm",
            "model.text_column": "description",
            "source.id_column": "id",
            "sink.path": str(out),
            "execution.progress": "none",
            **extra,
        }
    )
    t0 = time.perf_counter()
    run_job(cfg)
    return time.perf_counter() - t0


def main() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from helpers import make_catalog, read_output, write

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-incremental-"))
    try:
        old = make_catalog(n, seed=1)
        write(old, work / "old.parquet")
        run(work / "old.parquet", work / "prev", **{"sink.input_hash": True})
        rng = np.random.default_rng(2)
        desc = old["description"].to_pylist()
        for i in rng.choice(n, n // 20, replace=False):
            desc[i] = desc[i] + " (updated)"
        new = old.set_column(old.column_names.index("description"), "description", [pa.array(desc)])
        new = new.filter(pa.array(rng.random(n) >= 0.01))
        new = new.take(pa.array(rng.permutation(new.num_rows)))
        write(new, work / "new.parquet")
        full = run(work / "new.parquet", work / "full", **{"sink.input_hash": True})
        inc = run(work / "new.parquet", work / "inc", **{"source.previous": str(work / "prev")})
        a, b = read_output(work / "full").sort_by("id"), read_output(work / "inc").sort_by("id")
        same_ids = a["id"].equals(b["id"])
        ea = np.stack(a["embedding"].to_numpy(zero_copy_only=False))
        eb = np.stack(b["embedding"].to_numpy(zero_copy_only=False))
        print(
            f"incremental: full {full:.1f} s, incremental {inc:.1f} s = {inc / full:.1%} of full "
            f"(target <= 12%); same ids {same_ids}, max |vector difference| {np.abs(ea - eb).max():.2e}"
        )

        dup = make_catalog(n, seed=3)
        desc = dup["description"].to_pylist()
        src = rng.integers(0, n, n)
        for i in np.flatnonzero(rng.random(n) < 0.3):
            desc[i] = desc[src[i]]
        dup = dup.set_column(dup.column_names.index("description"), "description", [pa.array(desc)])
        write(dup, work / "dup.parquet")
        off = run(work / "dup.parquet", work / "off")
        on = run(work / "dup.parquet", work / "on", **{"runtime.dedupe": True})
        x, y = read_output(work / "off").sort_by("id"), read_output(work / "on").sort_by("id")
        ex = np.stack(x["embedding"].to_numpy(zero_copy_only=False))
        ey = np.stack(y["embedding"].to_numpy(zero_copy_only=False))
        distinct = len(set(desc))
        print(
            f"dedupe: off {off:.1f} s, on {on:.1f} s = {off / on:.2f}x rows/s (target >= 1.35x) with "
            f"{1 - distinct / n:.0%} duplicate rows; same ids {pc.all(pc.equal(x['id'], y['id'])).as_py()}, "
            f"max |vector difference| {np.abs(ex - ey).max():.2e}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
