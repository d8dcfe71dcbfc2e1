"""A job as a scheduler's task runs it (``bulkinfer.airflow``, ``bulkinfer.dagster``): the job file
and its overrides checked first (a bad config fails at once, not on every retry), then
``bulkinfer run`` in a child process whose output goes to the task's log, its exit code kept
(75: stopped, committed rows kept, a retry resumes) and its ``report.json`` read back.

A child process, not ``run_job`` in the scheduler's own process: a scheduler kills and signals
its task's process, and the job must answer SIGTERM by committing what is in flight and exiting 75
exactly as it does under Kubernetes."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import JobConfig, load_config
from .config.load import toml_value
from .core.errors import Interrupted
from .core.storage import storage_options_for
from .finished.read import normalise, private_json

__all__ = ["JobProcess", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    returncode: int
    output: str
    report: dict[str, Any] | None
    """The run's ``report.json`` (None when it wrote none: it failed before starting)."""

    @property
    def stopped(self) -> bool:
        """Stopped by a signal with its committed rows kept: running it again resumes."""
        return self.returncode == Interrupted.exit_code


class JobProcess:
    """``bulkinfer run JOB --set key=value ...`` in a child process."""

    def __init__(self, job: str | Path, overrides: Mapping[str, Any] | None = None, python: str | None = None) -> None:
        self.job = str(job)
        self.sets = [f"{key}={toml_value(value)}" for key, value in (overrides or {}).items()]
        self.cfg: JobConfig = load_config(self.job, sets=self.sets)  # a ConfigError here: no process started
        self.python = python or sys.executable
        self.proc: subprocess.Popen[str] | None = None

    @property
    def args(self) -> list[str]:
        sets = [arg for s in self.sets for arg in ("--set", s)]
        return [self.python, "-m", "bulkinfer", "run", self.job, *sets, "--progress", "log"]

    def run(self, log: Callable[[str], None]) -> Outcome:
        """Run to the end, each line the job prints passed to ``log``."""
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            log(line.rstrip("\n"))
        code = self.proc.wait()
        out = normalise(self.cfg.sink.path)
        with storage_options_for(self.cfg.sink.storage_options, [out]):
            return Outcome(code, out, private_json(out, "report.json"))

    def stop(self, grace_s: float) -> None:
        """SIGTERM the job (it commits what is in flight and exits 75); SIGKILL after ``grace_s``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
