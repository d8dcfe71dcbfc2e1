"""The one exception hierarchy of bulkinfer.

Every error a user can cause or meet is one of these, with a one-line message that
names the file, the row or the field and says what to do. The CLI prints the message
(never a traceback) and exits with the error's ``exit_code``::

    BulkinferError                 exit 1
    ├── ConfigError                a field is unknown, of the wrong type, or contradicts another
    ├── SourceError                an input cannot be listed, read or parsed (``uri`` names it)
    ├── ModelError                 the model cannot be found, loaded or run
    ├── ClusterError               the Ray cluster lost every worker and has no room for a new one
    ├── OutputError                the output directory cannot be written, or belongs to another job
    │   ├── LockedError            another live run holds the output directory
    │   └── JobMismatchError       the output holds a different job (config, model or input changed)
    ├── LedgerError                the ledger is corrupt; bulkinfer refuses rather than guess
    ├── ErrorBudgetExceeded        more rows failed than execution.max_errors / max_error_rate allow
    ├── CostLimitReached           the run's projected cost passed execution.max_cost; stopped cleanly
    ├── QualityGateError           a lowered precision is too far from fp32 on the job's own rows
    ├── CheckFailed                a gate on committed output failed: drift past monitor.max_psi
    │                              (--fail-on-drift), or a compare --fail-if condition held
    └── Interrupted                exit 75: stopped by a signal, safe to rerun the same command

Errors from libraries are translated at the boundary with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BulkinferError",
    "CheckFailed",
    "ClusterError",
    "ConfigError",
    "CostLimitReached",
    "ErrorBudgetExceeded",
    "Interrupted",
    "JobMismatchError",
    "LedgerError",
    "LockedError",
    "ModelError",
    "OutputError",
    "QualityGateError",
    "SourceError",
]


class BulkinferError(Exception):
    """Base of every bulkinfer error; ``str(err)`` is the one line shown to the user."""

    exit_code = 1


class ConfigError(BulkinferError):
    """The job configuration is invalid."""


class SourceError(BulkinferError):
    """An input file cannot be listed, opened or parsed; ``uri`` names it when one file is to blame
    (as httpx errors carry their request), so nothing has to parse the message."""

    def __init__(self, message: str, uri: str | None = None) -> None:
        super().__init__(message)
        self.uri = uri

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:  # Ray ships errors between processes
        return (type(self), (str(self), self.uri))


class ModelError(BulkinferError):
    """The model cannot be resolved, loaded or run."""


class ClusterError(BulkinferError):
    """Every worker of the Ray cluster is gone and no node fits a new one; committed shards are kept."""


class OutputError(BulkinferError):
    """The output location cannot be used."""


class LockedError(OutputError):
    """Another live process holds the output directory's lock."""


class JobMismatchError(OutputError):
    """The output directory holds a different job."""


class LedgerError(BulkinferError):
    """The ledger is unreadable or fails its checksums."""


class ErrorBudgetExceeded(BulkinferError):
    """More rows failed than the error budget allows; the failed rows are in ``_errors/``."""


class CostLimitReached(BulkinferError):
    """The run's projected cost passed ``execution.max_cost``: stopped after committing what was in
    flight; rerun (with a raised limit) to resume."""


class QualityGateError(BulkinferError):
    """A lowered precision failed the quality gate; the message and ``figures`` carry the figures,
    ``reference`` the fp32 reference's columns on the gate's rows (a search that follows reuses them)."""

    figures: dict[str, object] = {}  # noqa: RUF012 - replaced per instance
    reference: dict[str, Any] | None = None


class CheckFailed(BulkinferError):
    """A check on output that is committed and kept failed (drift, a canary comparison)."""


class Interrupted(BulkinferError):
    """The run was stopped by a signal; rerunning the same command resumes it."""

    exit_code = 75
