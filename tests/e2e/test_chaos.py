"""Fault injection for real: SIGKILL at random moments and at named points, SIGTERM mid-shard."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers import read_output, tabular_table, write

ADAPTER = textwrap.dedent("""
    import os
    import time
    from pathlib import Path
    from bulkinfer import Adapter

    class Slow(Adapter):
        input_columns = ("x1",)

        def __init__(self, delay=0.02):
            self.delay = delay

        def predict(self, batch):
            Path("started").touch()
            time.sleep(self.delay)
            with open("inferred.log", "a") as fh:  # rows each process really inferred
                fh.write(f"{os.getpid()} {batch.num_rows}\\n")
            return {"y": [round(v * 2, 9) for v in batch["x1"].to_pylist()]}
""")
ROWS = 2000
ARGS = [
    "-i",
    "in.parquet",
    "-m",
    "chaosmodel:Slow",
    "--id-column",
    "id",
    "--shard-rows",
    "150",
    "--batch-size",
    "25",
    "--set",
    "runtime.sort_window=50",
    "--progress",
    "none",
]


def _popen(cwd: Path, out: str, extra_env: dict[str, str] | None = None, args: list[str] = ARGS) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "bulkinfer", "run", *args, "-o", out],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("chaos")
    (d / "chaosmodel.py").write_text(ADAPTER)
    write(tabular_table(ROWS, seed=3), d / "in.parquet", row_group_size=150)
    proc = _popen(d, "clean")
    assert proc.wait() == 0, proc.communicate()
    return d


def _multiset(out: Path) -> Counter:
    t = read_output(out)
    return Counter(zip(t["id"].to_pylist(), t["y"].to_pylist(), strict=True))


def _assert_final(workdir: Path, out: str) -> None:
    assert _multiset(workdir / out) == _multiset(workdir / "clean")
    names = sorted(p.name for p in (workdir / out).iterdir())
    assert [n for n in names if not n.startswith("part-")] == ["_SUCCESS", "_bulkinfer"], names
    manifest = json.loads((workdir / out / "_SUCCESS").read_text())
    assert manifest["rows"] == ROWS and sorted(f["name"] for f in manifest["files"]) == [
        n for n in names if n.startswith("part-")
    ]


def _chaos(workdir: Path, seed: int) -> None:
    rng = random.Random(seed)
    out = f"chaos{seed}"
    lock = workdir / out / "_bulkinfer" / "lock"
    for attempt in range(40):
        proc = _popen(workdir, out)
        if attempt == 30:  # enough kills: this run must finish (and resume what the others committed)
            assert proc.wait(timeout=300) == 0, proc.communicate()
            break
        # kill at a random moment of the run, not of the interpreter's start-up (slow on a loaded machine):
        # from the moment this process holds the output's lock (or, one time in ten, during start-up)
        deadline = time.monotonic() + 60
        started = rng.random() > 0.1
        while started and proc.poll() is None and time.monotonic() < deadline and not _holds(lock, proc.pid):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.05, 1.5))
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.communicate()
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not (workdir / out).exists():  # killed before it made the output directory
            continue
        for p in (workdir / out).iterdir():  # at every instant, visible parts are whole
            if p.name.startswith("part-"):
                read_output_file(p)
    else:
        pytest.fail("never finished")
    _assert_final(workdir, out)


def _holds(lock: Path, pid: int) -> bool:
    try:
        return json.loads(lock.read_text() or "{}").get("pid") == pid
    except (OSError, ValueError):
        return False


def read_output_file(p: Path) -> None:
    import pyarrow.parquet as pq

    pq.read_table(p)


@pytest.mark.parametrize("seed", range(1))
def test_random_sigkill_loop_is_exactly_once(workdir, seed):
    _chaos(workdir, seed)


@pytest.mark.slow  # make test's pytest is at its 10 minutes: one seed there, the rest here
@pytest.mark.parametrize("seed", range(1, 24))
def test_random_sigkill_loop_many_seeds(workdir, seed):
    _chaos(workdir, seed)


@pytest.mark.parametrize("point", ["part-temp-written:3", "part-renamed:3", "success-temp-written"])
def test_kill_at_named_points(workdir, point):
    out = "named-" + point.split(":")[0]
    proc = _popen(workdir, out, {"BULKINFER_CRASH_AT": point})
    assert proc.wait() == -signal.SIGKILL, proc.communicate()
    visible = sorted(p.name for p in (workdir / out).iterdir() if not p.name.startswith((".", "_")))
    log_lines = (workdir / out / "_bulkinfer" / "commits.log").read_text().count("\n")
    if point.startswith("part-temp-written"):
        assert len(visible) == log_lines == 2  # the third part is only a hidden temp file
    elif point.startswith("part-renamed"):
        assert len(visible) == 3 and log_lines == 2  # a whole part the ledger does not vouch for
    else:
        assert not (workdir / out / "_SUCCESS").exists() and log_lines == 14
    rerun = _popen(workdir, out)
    assert rerun.wait() == 0, rerun.communicate()
    _assert_final(workdir, out)


def test_sigterm_commits_a_partial_shard_and_resume_does_only_the_rest(workdir):
    args = [
        "-i",
        "in.parquet",
        "-m",
        "chaosmodel:Slow",
        "--id-column",
        "id",
        "--shard-rows",
        "5000",
        "--batch-size",
        "25",
        "--set",
        "runtime.sort_window=100",
        "--set",
        "model.options={delay=0.03}",
        "--progress",
        "none",
    ]
    for f in ("started", "inferred.log"):
        (workdir / f).unlink(missing_ok=True)
    proc = _popen(workdir, "term", args=args)
    while not (workdir / "started").exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert time.monotonic() - t0 < 10
    (commit,) = [
        json.loads(line.split(" ", 1)[1])
        for line in (workdir / "term" / "_bulkinfer" / "commits.log").read_text().splitlines()
    ]
    assert commit["start"] == 0 and 0 < commit["stop"] < ROWS and commit["stop"] % 100 == 0  # whole windows
    done = commit["stop"]
    info = json.loads(
        subprocess.run(
            [sys.executable, "-m", "bulkinfer", "inspect", "term", "--json"],
            cwd=workdir,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert (info["rows_committed"], info["rows_remaining"], info["shards_remaining"]) == (done, ROWS - done, 1)
    (workdir / "inferred.log").unlink()
    rerun = _popen(workdir, "term", args=args)
    assert rerun.wait() == 0, rerun.communicate()
    inferred = sum(int(line.split()[1]) for line in (workdir / "inferred.log").read_text().splitlines())
    assert inferred == ROWS - done  # the resume inferred only the rows after the partial commit
    assert sorted(p.name for p in (workdir / "term").iterdir() if p.name.startswith("part-")) == [
        "part-00000.parquet",
        f"part-00000_{done:010d}.parquet",
    ]
    assert _multiset(workdir / "term") == _multiset(workdir / "clean")
    assert read_output(workdir / "term")["id"].to_pylist() == list(range(ROWS))  # name order is row order
