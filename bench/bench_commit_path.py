"""How many shards a second a cluster's driver can commit on a local folder: the commit path
alone (what the driver does with a part a worker staged: rename it into place, the ledger
line, the run's figures), without model time, without the workers' staging and without a
cluster's scheduling, which this 2-core box could not run at full speed beside it.

Usage: .venv/bin/python bench/bench_commit_path.py [SHARDS] [--groups 1,2,8,32]

Parts of 2 rows are staged first (as workers do), then committed by
``Committer.publish`` one at a time (group 1: the path before group commits) and by
``Committer.publish_many`` in groups of G: the shards that come back together are put in
place with one directory fsync and recorded with one ledger append. Every run is checked:
the ledger holds each shard once and every part is in place.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(n: int, group: int, work: Path) -> float:
    import pyarrow as pa

    from bulkinfer import load_config
    from bulkinfer.commit.committer import Committer
    from bulkinfer.commit.ledger import Ledger
    from bulkinfer.core.records import ShardOutput
    from bulkinfer.report import RunStats
    from bulkinfer.sinks import make_sink
    from bulkinfer.sources import Shard

    out = work / f"out-{group}"
    cfg = load_config(overrides={"sink.path": str(out), "source.paths": ["x.jsonl"], "model.name": "x:y"})
    sink = make_sink(cfg)
    sink.start()
    shards = [Shard(i, "x.jsonl", "jsonl", 2 * i, 2 * i + 2) for i in range(n)]
    table = pa.table({"id": [0, 1], "y": [0.5, 1.5]})
    staged = [sink.stage(ShardOutput(s, table), None, tag="w") for s in shards]  # the workers' part
    with Ledger(out) as ledger:
        stats = RunStats(rows_planned=2 * n)
        committer = Committer(ledger, sink, stats, cfg, {s.index: s.start for s in shards}, 0)
        t0 = time.perf_counter()
        if group == 1:
            for s in staged:
                committer.publish(s)
        else:
            for i in range(0, n, group):
                committer.publish_many(staged[i : i + group])
        took = time.perf_counter() - t0
        commits = ledger.commits()
    assert sorted(c.shard for c in commits) == list(range(n)), "each shard once"
    assert len(list(out.glob("part-*.parquet"))) == n, "every part in place"
    shutil.rmtree(out)
    return n / took


def main() -> None:
    sys.path.insert(0, str(HERE))
    from machine import describe

    print(describe())
    n = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 5000
    groups = [int(g) for g in (sys.argv[sys.argv.index("--groups") + 1] if "--groups" in sys.argv else "1,2,8,32")
              .split(",")]  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench-commit-", dir=HERE / "_work" if (HERE / "_work").is_dir() else None))
    try:
        base = None
        for g in groups:
            rate = run(n, g, work)
            base = base or rate
            print(f"group {g:>3}: {rate:8,.0f} shards/s committed ({rate / base:.2f}x group 1), {n:,} shards")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
