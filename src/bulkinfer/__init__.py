"""bulkinfer: offline (batch) inference with exactly-once, resumable output.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from __future__ import annotations

from ._version import __version__
from .adapters.image import ImageAdapter
from .adapters.protocol import Adapter, SetupContext
from .config import JobConfig, load_config
from .core.errors import (
    BulkinferError,
    CheckFailed,
    ClusterError,
    ConfigError,
    CostLimitReached,
    ErrorBudgetExceeded,
    Interrupted,
    JobMismatchError,
    LedgerError,
    LockedError,
    ModelError,
    OutputError,
    QualityGateError,
    SourceError,
)
from .job import RunResult, run_job
from .outputs.status import inspect_output

__all__ = [
    "Adapter",
    "BulkinferError",
    "CheckFailed",
    "ClusterError",
    "ConfigError",
    "CostLimitReached",
    "ErrorBudgetExceeded",
    "ImageAdapter",
    "Interrupted",
    "JobConfig",
    "JobMismatchError",
    "LedgerError",
    "LockedError",
    "ModelError",
    "OutputError",
    "QualityGateError",
    "RunResult",
    "SetupContext",
    "SourceError",
    "__version__",
    "inspect_output",
    "load_config",
    "run_job",
]
