"""Every thread of bulkinfer's runs in its starter's context (core.threads), so the settings that
differ between jobs in one process (the storage options) follow a job onto its threads."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import bulkinfer
from bulkinfer.core import storage
from bulkinfer.core.threads import pool, thread

SRC = Path(bulkinfer.__file__).parent


def test_threads_and_pools_are_made_only_by_core_threads():
    made = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("Thread", "ThreadPoolExecutor", "ProcessPoolExecutor"):
                    made.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert made == ["core/threads.py:22 Thread", "core/threads.py:27 ThreadPoolExecutor",
                    "core/threads.py:38 ProcessPoolExecutor"]  # fmt: skip


def _options_seen(uri: str) -> dict:
    return dict(storage.options_for(uri))


def test_a_jobs_storage_options_follow_it_onto_its_threads_and_no_further():
    seen: dict[str, dict] = {}
    with storage.storage_options_for({"endpoint_url": "http://a"}, ["s3://bucket/x"]):
        t = thread(lambda: seen.setdefault("thread", _options_seen("s3://bucket/y")), name="t")
        t.start()
        t.join()
        with pool(2, "p") as p:
            seen["pool"] = p.submit(_options_seen, "s3://other/z").result()
        plain = threading.Thread(target=lambda: seen.setdefault("plain", _options_seen("s3://bucket/y")))
        plain.start()
        plain.join()
        with storage.storage_options_for({"endpoint_url": "http://b"}, ["s3://bucket/prev"]):  # nested: an output
            seen["nested"] = _options_seen("s3://bucket/y")
        seen["after"] = _options_seen("s3://bucket/y")
    seen["outside"] = _options_seen("s3://bucket/y")
    assert seen == {
        "thread": {"endpoint_url": "http://a"},
        "pool": {"endpoint_url": "http://a"},
        "plain": {},  # a thread not made by core.threads starts without the job's context
        "nested": {"endpoint_url": "http://b"},
        "after": {"endpoint_url": "http://a"},
        "outside": {},
    }
