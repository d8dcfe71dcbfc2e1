"""Shared test helpers: data files, a cheap trained model, running the CLI for real."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from make_catalog import make_catalog  # noqa: F401  (re-exported for tests)

BULKINFER = [sys.executable, "-m", "bulkinfer"]


def tabular_table(n: int, seed: int = 0, start: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x1, x2, x3 = rng.normal(size=n), rng.normal(size=n), rng.integers(0, 5, size=n)
    return pa.table(
        {"id": np.arange(start, start + n), "x1": x1, "x2": x2, "x3": x3, "segment": [f"s{i % 3}" for i in range(n)]}
    )


def job_config(out: Path | str, paths: Sequence[Path | str], **extra: object):
    """The suite's one config builder: a job over ``paths`` (none: set by ``extra``) into ``out``
    with ids in ``id``, no progress display, and ``extra`` (dotted settings; None leaves a setting
    at its default, as a flag not given does)."""
    from bulkinfer import load_config

    base = {"source.paths": [str(p) for p in paths] or None, "source.id_column": "id", "sink.path": str(out),
            "execution.progress": "none"}  # fmt: skip
    return load_config(overrides={**base, **extra})


def fresh_module(tmp_path: Path, monkeypatch, prefix: str, source: str) -> str:
    """``source`` as an importable module of a fresh name (a cluster's reused worker processes keep
    modules they imported: a test's own module must not be an earlier test's)."""
    import uuid

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def write(table: pa.Table, path: Path, row_group_size: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=row_group_size)
    elif path.suffix == ".csv":
        pacsv.write_csv(table, path)
    elif path.suffix == ".jsonl":
        with path.open("w") as fh:
            for row in table.to_pylist():
                fh.write(json.dumps(row) + "\n")
    else:
        raise ValueError(path)
    return path


def train_classifier(path: Path, kind: str = "sklearn") -> Path:
    import joblib

    t = tabular_table(400, seed=1)
    x = np.column_stack([t[c].to_numpy() for c in ("x1", "x2", "x3")])
    y = np.where(x[:, 0] + 0.5 * x[:, 1] > 0, "yes", "no")
    if kind == "sklearn":
        import pandas as pd
        from sklearn.ensemble import RandomForestClassifier

        model = RandomForestClassifier(n_estimators=20, random_state=0)
        model.fit(pd.DataFrame(x, columns=["x1", "x2", "x3"]), y)
    else:
        import lightgbm as lgb
        import pandas as pd

        model = lgb.LGBMClassifier(n_estimators=20, verbose=-1)
        model.fit(pd.DataFrame(x, columns=["x1", "x2", "x3"]), y)
    joblib.dump(model, path)
    return path


def read_output(out: Path) -> pa.Table:
    """What a downstream reader sees: every visible file, ignoring _ and . names."""
    files = sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    fmt = files[0].suffix.lstrip(".") if files else "parquet"
    if fmt == "parquet":
        return pads.dataset([str(f) for f in files], format="parquet").to_table()
    if fmt == "csv":
        return pa.concat_tables([pacsv.read_csv(f) for f in files])
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    return pa.Table.from_pylist(rows)


def cli(
    *args: str, cwd: Path | None = None, check: bool = False, env: dict[str, str] | None = None, **kw: object
) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([*BULKINFER, *args], capture_output=True, text=True, cwd=cwd, env=env, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"bulkinfer {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def wait_commits(out: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until ``out``'s ledger has ``n`` commit lines (the run must still be alive)."""
    log = out / "_bulkinfer" / "commits.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count("\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no commit in time")


def stop_after_commits(out: Path, n: int) -> threading.Event:
    """An event set (as SIGTERM sets the job's) once ``out``'s ledger has ``n`` commit lines:
    ``run_job(cfg, stop=...)`` then stops after committing what it read."""
    stop = threading.Event()
    log = out / "_bulkinfer" / "commits.log"

    def watch() -> None:
        while not (log.exists() and log.read_text().count("\n") >= n):
            time.sleep(0.005)
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop


# `python launch.py REPORT run ...` runs bulkinfer and writes its own peak memory (VmHWM, kB)
# to REPORT as it exits. The peak is the run's own: wait4's ru_maxrss of a child counts what
# it shared with the pytest process before exec, so two runs could "measure equal" at the
# parent's size whatever bulkinfer does.
PEAK_LAUNCHER = """
import atexit, runpy, sys

report = sys.argv[1]

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(report, "w").write(line.split()[1])

atexit.register(peak)
sys.argv = ["bulkinfer", *sys.argv[2:]]
runpy.run_module("bulkinfer", run_name="__main__", alter_sys=True)
"""


def tiny_st_model(model: Path, minilm_path: Path) -> Path:
    """A tiny random-weight BERT in sentence-transformers layout at ``model`` (MiniLM's tokenizer
    and pooling, 2 layers of width 32): fast to export, quantize and search."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    top = str(minilm_path)  # the weights and config at the top are replaced; 1_Pooling's config is kept
    shutil.copytree(minilm_path, model, ignore=lambda where, names: {"model.safetensors", "config.json"} & set(names)
                    if where == top else set())  # fmt: skip
    torch.manual_seed(3)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512,
                         initializer_range=0.5)).eval().save_pretrained(model)  # fmt: skip
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    (model / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    return model


def race(n: int, attempt) -> list[object]:
    """``attempt(i)`` in ``n`` threads released at once: each one's result or exception."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = attempt(i)
        except Exception as exc:  # what each loser raised is checked by the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Server:
    """``bulkinfer serve`` (or ``command``: ``review``) as a process on a free port; ``url`` once it listens."""

    def __init__(
        self, args: list[str], cwd: Path, wait_ready: bool = True, command: str = "serve",
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        cmd = [sys.executable, "-m", "bulkinfer", command, "--port", "0", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
            if match:
                self.url, self.start_line = match.group(1), line
                break
        else:
            raise AssertionError(f"server did not start: {self.proc.wait()}")
        if wait_ready:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while httpx.get(f"{self.url}/readyz").status_code != 200:
            assert time.monotonic() < deadline, "model never became ready"
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def openai_schema_errors(name: str, body: object) -> list[str]:
    """Where ``body`` breaks OpenAI's published schema ``name`` (tests/specs/openai.json, taken
    from OpenAI's OpenAPI spec by tools/openai_schemas.py); [] when it validates. OpenAI answers
    null for an unset field where its schema has no null: such a null counts as absent (a
    required field that is null still fails, as missing)."""
    import copy

    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    spec = _nullable(json.loads((Path(__file__).parent / "specs" / "openai.json").read_text()))
    registry = Registry().with_resource("urn:openai", Resource.from_contents(spec, default_specification=DRAFT202012))
    validator = Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{name}"}, registry=registry)
    body = copy.deepcopy(body)
    while True:
        errors = list(validator.iter_errors(body))
        nulls = [list(e.absolute_path) for e in errors if e.instance is None and e.absolute_path]
        if not nulls:
            return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
        for path in nulls:
            parent: Any = body
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:  # a null in a list is not an unset field
                return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def _nullable(node: Any) -> Any:
    """OpenAPI's ``nullable: true`` as JSON Schema says it (null is one more allowed value): the
    spec marks some fields so (a chunk's ``finish_reason``), which a JSON Schema validator ignores."""
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


ARTIFACTS = Path(os.environ.get("BULKINFER_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    import pytest

    if path is None:  # make test installs it (tools/system_deps.sh): a missing browser is a failure, not a skip
        pytest.fail("chromium is missing: run make test (tools/system_deps.sh installs Debian's chromium)")
    return path


def crash_then_rerun(cwd: Path, point: str, env: dict[str, str] | None = None) -> None:
    """``bulkinfer run job.toml`` SIGKILLed by itself at ``point`` (BULKINFER_CRASH_AT), then run
    again to the end; each must end as said (the kill landed, the rerun finished)."""
    env = {**os.environ, **(env or {})}
    args = [*BULKINFER, "run", "job.toml", "--progress", "none"]
    proc = subprocess.run(args, cwd=cwd, env={**env, "BULKINFER_CRASH_AT": point}, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
