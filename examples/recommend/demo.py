"""The recommendation pipeline end to end, with the bundled model (``make demo-recommend``):

1. items: a generated catalog, embedded (``bulkinfer run items.toml``);
2. the item index (``bulkinfer index ... --min-recall``), with its recall printed;
3. users: a profile text and a history of item ids each; their top-50 items, history
   excluded, as a normal job (``bulkinfer run candidates.toml``: the index is the model);
4. the snapshot served: ``bulkinfer serve`` answers ``/v1/results/<user>`` from it and
   ``/v1/search`` from the index; one lookup of each is shown with curl.

With ``REDIS_URL`` set (a running Redis), step 3 also publishes the candidates to it (a
versioned snapshot, ``cand:<version>:<user>``) and the server answers lookups from Redis.

Usage: python examples/recommend/demo.py [--items N] [--users N] [--workdir DIR]
Paths in the job files are relative to the working directory (the repository root).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from make_catalog import WORDS, make_catalog  # noqa: E402

BULKINFER = [sys.executable, "-m", "bulkinfer"]


def make_users(n: int, n_items: int, seed: int = 5) -> pa.Table:
    """Users with a short profile (a few catalog words) and a history of 3..12 item ids."""
    rng = random.Random(seed)
    profiles = [" ".join(rng.choices(WORDS, k=rng.randint(4, 14))) for _ in range(n)]
    history = [rng.sample(range(n_items), rng.randint(min(3, n_items), min(12, n_items))) for _ in range(n)]
    return pa.table({"user_id": [f"u{i:06d}" for i in range(n)], "profile": profiles, "history": history})


def step(title: str, *args: str, quiet: bool = False) -> str:
    print(f"\n== {title}\n$ bulkinfer {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([*BULKINFER, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}):\n{proc.stderr}")
    if not quiet:
        print(proc.stdout.strip())
    print(f"({time.perf_counter() - t0:.1f} s)")
    return proc.stdout


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, default=5000)
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--workdir", default="demo/recommend")
    a = p.parse_args()
    if a.items < 1 or a.users < 1:
        p.error("--items and --users must be at least 1")
    work = Path(a.workdir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    pq.write_table(make_catalog(a.items), work / "items.parquet", row_group_size=2000)
    pq.write_table(make_users(a.users, a.items), work / "users.parquet", row_group_size=1000)
    print(f"generated {a.items} items and {a.users} users in {work}/")

    items, index, cands = work / "items", work / "items.index", work / "candidates"
    step("1. embed the items", "run", str(HERE / "items.toml"), "-i", str(work / "items.parquet"), "-o", str(items),
         "--progress", "none")  # fmt: skip
    step("2. build the item index", "index", str(items), "-o", str(index), "--kind", "hnsw", "--min-recall", "0.9")
    redis_url = os.environ.get("REDIS_URL")  # also publish the snapshot to Redis when one is running
    publish = ["--set", f"export=[{{kind = 'redis', url = '{redis_url}', key = 'cand:{{user_id}}', "
               "columns = ['neighbors', 'scores'], encoding = 'json'}]"] if redis_url else []  # fmt: skip
    step("3. top-50 items per user, history excluded" + (f", published to {redis_url}" if redis_url else ""),
         "run", str(HERE / "candidates.toml"), "-i", str(work / "users.parquet"), "-m", str(index),
         "-o", str(cands), "--progress", "none", *publish)  # fmt: skip
    first = pq.read_table(sorted(cands.glob("part-*.parquet"))[0]).slice(0, 1).to_pylist()[0]
    user = first["user_id"]
    print(f"   {user}: {first['neighbors'][:8]}... (scores {[round(s, 3) for s in first['scores'][:3]]}...)")

    print("\n== 4. serve the snapshot and the index")
    results = redis_url or str(cands)  # the snapshot the lookups answer from
    cmd = [*BULKINFER, "serve", "--model", str(index), "--text-column", "profile", "--id-column", "user_id",
           "--k", "50", "--port", "0", "--set", f"serve.results='{results}'", *publish]  # fmt: skip
    print("$ bulkinfer " + " ".join(cmd[3:]))
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        url = _wait_for_url(server)
        _wait_ready(url)
        lookup = f"curl -s {url}/v1/results/{user}"
        print(f"$ {lookup}\n{_curl(lookup)[:300]}...")
        body = json.dumps({"query": "wireless noise cancelling headphones", "k": 5})
        search = f"curl -s -X POST {url}/v1/search -H 'Content-Type: application/json' -d '{body}'"
        print(f"$ {search}\n{_curl(search)}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"\nresults: {cands}/part-*.parquet (user_id, neighbors, scores); index: {index} (+ .json, .ids.parquet)")


def _wait_for_url(server: subprocess.Popen) -> str:
    assert server.stderr is not None
    for line in server.stderr:
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if match:
            return match.group(1)
    sys.exit(f"the server did not start ({server.wait()})")


def _wait_ready(url: str) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/readyz").status_code != 200:
        if time.monotonic() > deadline:
            sys.exit("the server's model never became ready")
        time.sleep(0.2)


def _curl(command: str) -> str:
    """Run the shown curl command (or the same request with httpx where curl is missing)."""
    if shutil.which("curl"):
        return subprocess.run(command, shell=True, capture_output=True, text=True, env=os.environ).stdout
    import httpx

    parts = command.split()
    if "-X" in parts:
        body = command.split("-d '", 1)[1].rstrip("'")
        return httpx.post(parts[parts.index("-X") + 2], content=body, headers={"Content-Type": "application/json"}).text
    return httpx.get(parts[-1]).text


if __name__ == "__main__":
    main()
