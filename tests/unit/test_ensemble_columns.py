"""Which columns a rule or a model may read of several models: ``<model>.<column>`` must be one
the model writes (when it declares them); a name without a model's prefix is an input column,
even where it equals a model's name."""

from __future__ import annotations

import pytest

from bulkinfer.adapters import Adapter
from bulkinfer.adapters.ensemble import Member, check_columns
from bulkinfer.core.errors import ConfigError
from bulkinfer.core.expr import parse


class Declared(Adapter):
    output_columns = ("toxic",)


def test_a_rule_over_an_input_column_named_like_a_model_is_not_refused():
    members = [Member("text", Declared(), 16)]
    check_columns(parse("text == 'x' and text.toxic > 0.5"), members, "decision.rules.block")
    with pytest.raises(ConfigError, match=r"^decision\.rules\.block: reads 'text\.toxc', which model 'text' does not"):
        check_columns(parse("text.toxc > 0.5"), members, "decision.rules.block")
