"""Whether a cluster's driver keeps up with many fast shards (#38 item 3): the same job of tiny
shards and an instant model (``bench/instant.py``) on the local backend, on Ray (2 workers on a
local instance) and on Spark (``local[2]``), in one run.

Usage: .venv/bin/python bench/bench_driver.py [--shards 2000] [--rows-per-shard 2]

Printed per backend, from its ``report.json``: shards per second end to end (the run's rows/s
over rows per shard, model set-up and cluster start excluded), the calls or tasks the shards
went in, the driver's commit path (``commit.shards_per_s``) and, on Ray, the driver process's CPU
per shard (``backend.driver_cpu_s``) and the shards a second that CPU would sustain. On a box
with as many cores as workers, the workers share the cores with the driver: the end-to-end rate
is theirs, the driver's capacity is the last column.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = {
    "local": [],
    "ray": ["--backend", "ray", "--set", "execution.workers=2"],
    "spark": ["--backend", "spark", "--set", "execution.spark_master='local[2]'"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=2000)
    ap.add_argument("--rows-per-shard", type=int, default=2)
    ap.add_argument("--backends", default="local,ray,spark")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from machine import describe

    print(describe())
    exe = Path(sys.executable).parent / "bulkinfer"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1"}
    per = args.rows_per_shard
    print(f"{args.shards:,} shards of {per} rows, instant model")
    head = ("backend", "shards/s", "calls", "commit path/s", "driver CPU/shard", "driver could do/s")
    print(f"{head[0]:<8} {head[1]:>9} {head[2]:>7} {head[3]:>14} {head[4]:>17} {head[5]:>18}")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        with open(src, "w") as fh:
            for i in range(args.shards * per):
                fh.write(f'{{"id": {i}, "x": {i * 0.5}}}\n')
        for name in args.backends.split(","):
            out = Path(tmp) / f"out-{name}"
            cmd = [str(exe), "run", "-i", str(src), "-o", str(out), "-m", "instant:Instant", "--feature-columns", "x",
                   "--id-column", "id", "--progress", "none", "-q", "--set", f"source.shard_rows={per}",
                   *BACKENDS[name]]  # fmt: skip
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            r = json.loads((out / "_bulkinfer" / "report.json").read_text())
            assert r["rows_out"] == args.shards * per, r["rows_out"]
            b = r.get("backend", {})
            calls = b.get("calls", b.get("tasks", args.shards))
            cpu = b.get("driver_cpu_s")
            cpu_ms = f"{cpu / args.shards * 1000:.2f} ms" if cpu else "-"
            could = f"{args.shards / cpu:,.0f}" if cpu else "-"
            print(f"{name:<8} {r['rows_per_s'] / per:>9,.0f} {calls:>7,} {r['commit']['shards_per_s']:>14,.0f} "
                  f"{cpu_ms:>17} {could:>18}")  # fmt: skip


if __name__ == "__main__":
    main()
