"""The job's own state at many shards: no model time, only bulkinfer's planning, commit path,
resume and inspect, measured at growing shard counts in one run.

Usage: .venv/bin/python bench/bench_scale.py [--shards 10000,100000] [--rows-per-shard 2]

For each size N, one JSONL input of N x rows-per-shard rows and `source.shard_rows` =
rows-per-shard. The model is an instant custom adapter (``bench/instant.py``: a column copied).
Printed per size:

- plan time (`bulkinfer inspect`-free: the run's set-up until its first commit);
- the run's time per shard (commit path only);
- resume time after a SIGKILL at half (the rerun's wall), and its set-up alone (reading the
  plan and the ledger until the first shard runs: what a resume costs beyond the work left);
- `bulkinfer inspect --json` time;
- the driver's peak memory (the run's max RSS);
- the size of every state file (`_bulkinfer/*`, `_SUCCESS`).

It also prints the growth exponent k between consecutive sizes (time ∝ n^k).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def bulkinfer() -> list[str]:
    exe = Path(sys.executable).parent / "bulkinfer"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bulkinfer"]


def make_input(path: Path, rows: int) -> None:
    with open(path, "w") as fh:
        for i in range(rows):
            fh.write(f'{{"id": {i}, "x": {i * 0.5}}}\n')


def job(src: Path, out: Path, per_shard: int) -> list[str]:
    return [*bulkinfer(), "run", "-i", str(src), "-o", str(out), "-m", "instant:Instant", "--feature-columns", "x",
            "--id-column", "id", "--progress", "none", "-q", "--set", f"source.shard_rows={per_shard}"]  # fmt: skip


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1"}


def timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one command (its own process tree's maximum)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, rusage = os.wait4(proc.pid, 0)[1:]
    if proc.stderr is not None and (err := proc.stderr.read().strip()) and "error" in err:
        raise SystemExit(err)
    return time.perf_counter() - t0, rusage.ru_maxrss


def commits(out: Path) -> int:
    log = out / "_bulkinfer" / "commits.log"
    return log.read_bytes().count(b"\n") if log.exists() else 0


def killed_at_half(cmd: list[str], out: Path, shards: int) -> None:
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while commits(out) < shards // 2:
        if proc.poll() is not None:
            raise SystemExit("the run ended before half its shards were committed")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def state_sizes(out: Path) -> dict[str, int]:
    files = [*sorted((out / "_bulkinfer").glob("*")), out / "_SUCCESS"]
    return {f.name: f.stat().st_size for f in files if f.is_file()}


def measure(n: int, per_shard: int, work: Path) -> dict[str, float]:
    src = work / f"in-{n}.jsonl"
    make_input(src, n * per_shard)
    out = work / f"out-{n}"
    run_s, rss = timed(job(src, out, per_shard))
    report = json.loads((out / "_bulkinfer" / "report.json").read_text())
    assert report["shards"]["committed"] == n, report["shards"]
    inspect_s, _ = timed([*bulkinfer(), "inspect", "--json", str(out)])
    again = work / f"again-{n}"
    killed_at_half(job(src, again, per_shard), again, n)
    resume_s, resume_rss = timed(job(src, again, per_shard))
    resumed = json.loads((again / "_bulkinfer" / "report.json").read_text())
    sizes = state_sizes(out)
    figures = {
        "shards": n, "run_s": run_s, "setup_s": report["setup_s"], "per_shard_ms": report["run_s"] / n * 1000,
        "resume_s": resume_s, "resume_setup_s": resumed["setup_s"], "inspect_s": inspect_s,
        "peak_mib": max(rss, resume_rss) / 1024, "run_mib": rss / 1024, "resume_mib": resume_rss / 1024,
        "state_bytes": sum(sizes.values()),
    }  # fmt: skip
    print(
        f"{n:>9,} shards: run {run_s:7.1f} s (set-up {report['setup_s']:.1f} s, {figures['per_shard_ms']:.2f} ms "
        f"a shard = {n / report['run_s']:,.0f} shards/s), resume after a kill at half {resume_s:6.1f} s (set-up "
        f"{resumed['setup_s']:.1f} s), inspect {inspect_s:5.1f} s, peak {figures['peak_mib']:6.0f} MiB (run "
        f"{figures['run_mib']:.0f}, resume {figures['resume_mib']:.0f}); state: "
        + ", ".join(f"{k} {v / 1024:,.0f} KiB" for k, v in sizes.items()),
        flush=True,
    )
    return figures


def main() -> None:
    from machine import describe

    print(describe())
    sizes = [int(x) for x in (sys.argv[sys.argv.index("--shards") + 1] if "--shards" in sys.argv else "10000,100000")
             .split(",")]  # fmt: skip
    per_shard = int(sys.argv[sys.argv.index("--rows-per-shard") + 1]) if "--rows-per-shard" in sys.argv else 2
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    rows = [measure(n, per_shard, work) for n in sizes]
    for a, b in itertools.pairwise(rows):
        ratio = math.log(b["shards"] / a["shards"])
        grow = {k: math.log(max(b[k], 1e-9) / max(a[k], 1e-9)) / ratio
                for k in ("run_s", "resume_s", "resume_setup_s", "inspect_s", "state_bytes", "peak_mib")}  # fmt: skip
        print(f"growth {a['shards']:,} -> {b['shards']:,} (time ∝ n^k): "
              + ", ".join(f"{k} k={v:.2f}" for k, v in grow.items()))  # fmt: skip
    print(f"(peak memory is the max RSS of the run's process; {resource.getpagesize()} B pages)")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
