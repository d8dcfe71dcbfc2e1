"""The names of an output's layout that more than one stage reads or writes. A reader that
skips names starting with ``_`` or ``.`` sees only committed parts; these are the ``_`` names.

::

    OUT/part-00000.parquet   committed parts (named by sinks/files.part_name)
    OUT/_SUCCESS             the manifest, written last (SUCCESS)
    OUT/_errors/             one record per failed row (ERRORS)
    OUT/_bulkinfer/          the ledger, the lock, job.json, report.json (PRIVATE)
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DELETED", "ERRORS", "HASH_COLUMN", "PRIVATE", "STATS", "SUCCESS", "result_columns"]

PRIVATE = "_bulkinfer"
"""The output's private folder: the ledger, the lock, the plan, the report."""
SUCCESS = "_SUCCESS"
"""The manifest of a complete output (files, row counts, checksums), written last."""
ERRORS = "_errors"
"""One record per failed row, in files named after the part they belong to."""
DELETED = "_deleted.parquet"
"""An incremental run's ids no longer in the input (written by the finish step)."""
STATS = "stats.json"
"""Under PRIVATE: the committed rows' column statistics (a later run's drift baseline)."""
HASH_COLUMN = "_input_hash"
"""Each row's input hash (``sink.input_hash``; always in an incremental run's output)."""


def result_columns(names: Iterable[str]) -> list[str]:
    """An output's columns as its readers mean them (the ids, kept columns and results), in
    order: without :data:`HASH_COLUMN`, which only an incremental run reads. Comparisons,
    route conditions, served rows and column hints go by these."""
    return [n for n in names if n != HASH_COLUMN]
