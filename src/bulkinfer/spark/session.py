"""The Spark session bulkinfer runs on: the active one (a user's own PySpark application), or one
started for the job at ``execution.spark_master`` with ``execution.spark_conf``. Only this
package and :mod:`bulkinfer.runners.spark` import pyspark."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError

__all__ = ["pyspark_module", "spark_session", "workers_python"]

log = logging.getLogger("bulkinfer")

_LOG4J = Path(__file__).resolve().parent.parent / "data" / "log4j2-spark.properties"


def pyspark_module() -> Any:
    try:
        import pyspark
    except ImportError as exc:
        raise ConfigError("Spark needs PySpark: pip install 'bulkinfer[spark]' (and Java 17 or newer)") from exc
    return pyspark


def spark_session(master: str | None, conf: Mapping[str, str], task_cpus: int | None = None) -> tuple[Any, bool]:
    """``(session, started_here)``: the active session when there is one (its master must be
    ``master`` when that is given), else a new one at ``master`` (default ``local[*]``) with
    ``conf``. A local master's Python workers run this interpreter (this virtual environment)."""
    pyspark_module()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        have = active.sparkContext.master
        if master is not None and master != have:
            raise ConfigError(
                f"execution.spark_master = {master!r}, but this process already runs a Spark session on {have!r}; "
                "drop spark_master to use it, or run the job outside that application"
            )
        if conf:
            raise ConfigError(
                "execution.spark_conf cannot change the Spark session this process already runs; "
                "set those options where the session is built"
            )
        return active, False
    master = master or "local[*]"
    builder = SparkSession.builder.master(master).appName("bulkinfer")
    # Spark's own log lines stay off the job's console: a failed task is reported once, by the job
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",  # the job shows its own progress
        "spark.python.worker.reuse": "true",  # a Python worker keeps the job's model from task to task
        "spark.log.level": "OFF",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_LOG4J}",
        **conf,
    }
    if task_cpus is not None and "spark.task.cpus" not in conf:
        settings["spark.task.cpus"] = str(task_cpus)
    # PySpark starts its Python workers with $PYSPARK_PYTHON (default python3): on a local master,
    # this interpreter, whose environment has bulkinfer and the job's model code
    python = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    if python or master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = python or sys.executable
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with warnings.catch_warnings():  # PySpark's note on the pandas version: its pandas API is not used
            warnings.simplefilter("ignore", FutureWarning)
            session = builder.getOrCreate()
    except Exception as exc:  # the JVM did not start: no Java, a bad master URL
        msg = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"execution.spark_master = {master!r}: Spark did not start ({msg}); "
            "check Java 17+ (JAVA_HOME) and the master URL"
        ) from exc
    log.info("spark: %s (%d task slot(s))", session.sparkContext.master, session.sparkContext.defaultParallelism)
    return session, True


def workers_python(session: Any) -> None:
    """The Python a running session's workers start for bulkinfer's tasks: on a local master,
    this interpreter unless ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` names one (PySpark's
    default, ``python3``, is the system's, without bulkinfer, pyarrow or the model: the job
    would fail deep in Py4J); on a cluster the workers' Python must be named, or one line says so."""
    sc = session.sparkContext
    named = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python", None)
    if named:
        return
    if sc.master.startswith("local"):
        sc.pythonExec = sys.executable  # read when each Python function is made: the tasks made after this
        return
    raise ConfigError(
        f"PYSPARK_PYTHON: the Spark master {sc.master!r} starts its Python workers with the default python3; set "
        "PYSPARK_PYTHON (or spark.pyspark.python) to the workers' Python that has bulkinfer installed"
    )
