"""``bulkinfer run``'s flags map onto config fields by one table: every flag is in it, and a
flag left out (None, a switch off, an empty list) never overrides the job file's value."""

from __future__ import annotations

import inspect

from bulkinfer.cli.run import FLAG_FIELDS, overrides, run
from bulkinfer.config import JobConfig

NOT_FIELDS = {"config", "set_", "retry_errors", "quiet"}  # the file, --set, the retry source, logging


def _flags(**given):
    names = inspect.signature(run).parameters
    return {n: given.get(n, p.default) for n, p in names.items()}


def test_every_flag_of_run_sets_a_config_field_that_exists():
    assert set(inspect.signature(run).parameters) - NOT_FIELDS == set(FLAG_FIELDS)
    for field in FLAG_FIELDS.values():
        section, _, name = field.partition(".")
        assert section in JobConfig.model_fields, field
        sub = JobConfig.model_fields[section].annotation
        assert name.split(".")[0] in sub.model_fields, field


def test_flags_left_out_set_nothing_and_zero_is_a_value():
    fields = overrides(_flags())
    assert {k: v for k, v in fields.items() if v is not None} == {}
    fields = overrides(_flags(batch_size=0, max_cost=0.0, keep_columns=["a, b", "c"], overwrite=True, input=[]))
    given = {k: v for k, v in fields.items() if v is not None}
    assert given == {
        "runtime.batch_size": 0,
        "execution.max_cost": 0.0,
        "sink.keep_columns": ["a", "b", "c"],
        "execution.overwrite": True,
    }
