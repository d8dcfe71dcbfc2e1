from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bulkinfer.core.schema import convert_rows, fit_value, parse_type, type_name, unify

TYPES = [pa.null(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(), pa.bool_(), pa.date32()]


@given(st.lists(st.sampled_from(TYPES), max_size=6))
def test_unify_gives_a_type_every_value_fits(types):
    got = unify(types)
    known = [t for t in types if t != pa.null()]
    if not known:
        assert got is None
        return
    samples = {pa.int32(): 7, pa.int64(): 7, pa.float32(): 1.5, pa.float64(): 1.5, pa.string(): "x",
               pa.bool_(): True, pa.date32(): 0}  # fmt: skip
    for t in known:  # a value of each input type converts to the unified type
        pa.array([samples[t]], type=t).cast(got)
    assert unify(types + types) == got  # and unify is stable under repetition
    assert unify(reversed(types)) == got  # and order


def test_unify_widens_numbers_and_falls_back_to_string():
    assert unify([pa.int32(), pa.int64()]) == pa.int64()
    assert unify([pa.int64(), pa.float64(), pa.null()]) == pa.float64()
    assert unify([pa.int64(), pa.string()]) == pa.string()
    assert unify([pa.bool_(), pa.int64()]) == pa.string()
    assert unify([pa.null()]) is None


def test_type_names_round_trip():
    for t in (pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.date32()):
        assert parse_type(type_name(t)) == t
    with pytest.raises(ValueError, match="unknown type 'text'"):
        parse_type("text")


def test_fit_value_converts_what_fits_and_refuses_the_rest():
    assert fit_value(3, pa.float64()) == 3.0
    assert fit_value(1.5, pa.string()) == "1.5" and fit_value(True, pa.string()) == "true"
    assert fit_value(None, pa.int64()) is None
    for value, target in ((1.5, pa.int64()), ("abc", pa.float64()), (True, pa.int64()), ([1], pa.float64())):
        with pytest.raises(ValueError, match=f"is not {target}"):
            fit_value(value, target)


def test_convert_rows_fails_only_the_rows_that_do_not_fit():
    table = pa.table({"x": ["1", "2.5", "oops", None, "4"], "s": ["a", "b", "c", "d", "e"]})
    bad = []
    out, rows = convert_rows(
        table, {"x": pa.float64(), "s": pa.string()}, np.arange(10, 15), lambda r, m: bad.append((r, m))
    )
    assert out["x"].to_pylist() == [1.0, 2.5, None, 4.0] and out["s"].to_pylist() == ["a", "b", "d", "e"]
    assert rows.tolist() == [10, 11, 13, 14]
    assert bad == [
        (12, "column 'x': 'oops' is not double (the column's type in this job; fix the value or set "
         "source.column_types)")
    ]  # fmt: skip
