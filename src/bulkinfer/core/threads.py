"""Threads that work for one job carry its context: the settings that differ between jobs in
one process (the storage options its inputs open with: :mod:`.storage`) live in
:mod:`contextvars`, and a thread started here runs in a copy of its starter's context, so two
jobs of the batch service, each on its own threads, never see each other's. Every thread and
thread pool of bulkinfer's is made here (``tests/unit/test_threads.py`` holds that), and so is its
one kind of process pool (``processes``: spawned, for work that holds the interpreter)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

__all__ = ["pool", "processes", "thread"]


def thread(target: Callable[..., Any], *args: Any, name: str, daemon: bool = True) -> threading.Thread:
    """A (not yet started) thread running ``target(*args)`` in a copy of this thread's context."""
    context = contextvars.copy_context()
    return threading.Thread(target=context.run, args=(target, *args), name=name, daemon=daemon)


def pool(max_workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads each start in a copy of this thread's context."""
    return ThreadPoolExecutor(
        max_workers=max_workers, thread_name_prefix=name, initializer=_enter, initargs=(contextvars.copy_context(),)
    )


def processes(max_workers: int) -> ProcessPoolExecutor:
    """A pool of spawned processes (a clean interpreter: no threads or locks inherited from the
    job's) for work that holds the interpreter (RDKit parsing SMILES). No job context follows into
    them: a task takes what it needs as its arguments."""
    import multiprocessing as mp

    return ProcessPoolExecutor(max_workers, mp_context=mp.get_context("spawn"))


def _enter(context: contextvars.Context) -> None:
    for var, value in context.items():
        var.set(value)
