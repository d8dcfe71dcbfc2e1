"""bulkinfer inside users' own PySpark pipelines: :func:`predict` adds a model's outputs to a
DataFrame. (``execution.backend = "spark"`` runs a whole job on Spark: :mod:`bulkinfer.runners.spark`.)"""

from __future__ import annotations

from .predict import predict

__all__ = ["predict"]
