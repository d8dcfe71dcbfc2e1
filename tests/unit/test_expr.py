"""The routing expression language: parse/print round trip and vectorised evaluation equal to a
row-by-row reference, over random expressions and tables (hypothesis)."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulkinfer.core.expr import (
    Bin,
    Call,
    Col,
    ExprError,
    Field,
    Filter,
    In,
    IsNull,
    Lit,
    Neg,
    Not,
    columns,
    evaluate,
    mask,
    parse,
    to_text,
)

NAMES = st.sampled_from(["a", "b", "s", "flag", "proba_unsafe", "x.y", "my col"])
NUMBERS = st.one_of(st.integers(0, 10**6), st.floats(0, 1e9, allow_nan=False, allow_infinity=False))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
LITERALS = st.one_of(NUMBERS, TEXT, st.booleans(), st.none())


def trees(leaves, lists=False):
    def forms(sub):
        listed = [
            st.builds(Filter, sub, sub),
            st.builds(Field, sub, st.sampled_from(["score", "label", "x_1"])),
            st.builds(Call, st.sampled_from(["max", "min", "sum", "mean", "count", "any", "all"]), sub),
        ]
        return st.one_of(
            st.builds(Neg, sub),
            st.builds(Not, sub),
            st.builds(
                Bin, st.sampled_from(["or", "and", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/"]), sub, sub
            ),
            st.builds(IsNull, sub, st.booleans()),
            st.builds(In, sub, st.lists(st.integers(-5, 5), min_size=1, max_size=3).map(tuple), st.booleans()),
            *(listed if lists else []),
        )

    return st.recursive(leaves, forms, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(trees(st.one_of(st.builds(Lit, LITERALS), st.builds(Col, NAMES)), lists=True))
def test_print_then_parse_is_the_same_tree(tree):
    assert parse(to_text(tree)) == tree


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        ("proba_unsafe >= 0.8", Bin(">=", Col("proba_unsafe"), Lit(0.8))),
        (
            "a + 2 * b > 3 and not flag",
            Bin("and", Bin(">", Bin("+", Col("a"), Bin("*", Lit(2), Col("b"))), Lit(3)), Not(Col("flag"))),
        ),
        (
            "label in ('spam', 'scam') or x is not null",
            Bin("or", In(Col("label"), ("spam", "scam")), IsNull(Col("x"), True)),
        ),
        ('`my col` != "it\'s"', Bin("!=", Col("my col"), Lit("it's"))),
        ("-a < -1.5e3", Bin("<", Neg(Col("a")), Neg(Lit(1500.0)))),
        ("a not in (1, -2)", In(Col("a"), (1, -2), True)),
    ],
)
def test_precedence_and_forms(text, tree):
    assert parse(text) == tree


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("proba >= ", r"expected a value, a column or '\(' at 9, got 'end of text'"),
        ("proba >> 1", r"expected a value, a column or '\(' at 7, got '>'"),
        ("(a > 1", r"expected '\)' at 6"),
        ("a $ 1", r"unexpected '\$' at 2"),
        ("a is 1", r"expected null at 5, got '1'"),
        ("a in (b)", r"expected a literal at 6, got 'b'"),
        ("a b", r"expected an operator or the end at 2, got 'b'"),
    ],
)
def test_errors_name_the_token_and_position(text, message):
    with pytest.raises(ExprError, match=message):
        parse(text, "route[0].when")
    with pytest.raises(ExprError, match=r"^route\[0\]\.when: "):
        parse(text, "route[0].when")


def test_columns_and_a_missing_column_or_a_non_boolean_are_named():
    t = pa.table({"a": [1, 2]})
    assert columns(parse("a > 1 and b is null or c + 1 in (2)")) == {"a", "b", "c"}
    with pytest.raises(ExprError, match=r"route\[1\]\.when: no column 'proba' \(the rows have a\)"):
        mask(parse("proba > 0.5"), t, "route[1].when")
    with pytest.raises(ExprError, match=r"is double, not true/false"):
        mask(parse("a + 1"), t)
    with pytest.raises(ExprError, match=r"cannot compare"):
        mask(parse("a == 'x'"), t)


# -- evaluation equals a row-by-row reference --------------------------------------------


class Refused(Exception):
    pass


def _kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "num"
    return "str"


def ref(node, row, kinds):
    """(kind, value) of ``node`` for one row; Refused where a type does not fit (whatever the row)."""
    if isinstance(node, Lit):
        return _kind(node.value), node.value
    if isinstance(node, Col):
        return kinds[node.name], row[node.name]
    if isinstance(node, IsNull):
        _k, v = ref(node.arg, row, kinds)
        return "bool", (v is not None) if node.negated else (v is None)
    if isinstance(node, In):
        k, v = ref(node.arg, row, kinds)
        if k not in ("num", "null"):
            raise Refused
        if v is None:
            return "bool", None
        found = any(v == x for x in node.values)
        return "bool", (not found) if node.negated else found
    if isinstance(node, Neg):
        k, v = ref(node.arg, row, kinds)
        if k not in ("num", "null"):
            raise Refused
        return "num", None if v is None else -float(v)
    if isinstance(node, Not):
        k, v = ref(node.arg, row, kinds)
        if k not in ("bool", "null"):
            raise Refused
        return "bool", None if v is None else not v
    (lk, lv), (rk, rv) = ref(node.left, row, kinds), ref(node.right, row, kinds)
    if node.op in ("and", "or"):
        if lk not in ("bool", "null") or rk not in ("bool", "null"):
            raise Refused
        if node.op == "and":
            if lv is False or rv is False:
                return "bool", False
            return "bool", None if lv is None or rv is None else True
        if lv is True or rv is True:
            return "bool", True
        return "bool", None if lv is None or rv is None else False
    if node.op in "+-*/":
        if lk not in ("num", "null") or rk not in ("num", "null"):
            raise Refused
        if lv is None or rv is None:
            return "num", None
        a, b = float(lv), float(rv)
        if node.op == "/":
            if b == 0:
                return "num", math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
            return "num", a / b
        return "num", {"+": a + b, "-": a - b, "*": a * b}[node.op]
    if lk != rk and "null" not in (lk, rk):
        raise Refused
    if lv is None or rv is None:
        return "bool", None
    if lk == "num":
        lv, rv = float(lv), float(rv)
    return "bool", {"==": lv == rv, "!=": lv != rv, "<": lv < rv, "<=": lv <= rv, ">": lv > rv, ">=": lv >= rv}[node.op]


ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "a": st.one_of(st.none(), st.integers(-5, 5)),
            "b": st.one_of(st.none(), st.floats(-10, 10, allow_nan=False), st.just(0.0)),
            "s": st.one_of(st.none(), st.sampled_from(["", "ok", "spam", "é"])),
            "flag": st.one_of(st.none(), st.booleans()),
        }
    ),
    min_size=1,
    max_size=12,
)
SMALL = st.one_of(
    st.integers(-3, 3), st.sampled_from([0.5, 0.0, 2.5]), st.sampled_from(["ok", "spam"]), st.booleans(), st.none()
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(st.one_of(st.builds(Lit, SMALL), st.builds(Col, st.sampled_from(["a", "b", "s", "flag"])))), ROWS)
def test_vectorised_evaluation_equals_the_row_reference(tree, rows):
    table = pa.table(
        {
            "a": pa.array([r["a"] for r in rows], pa.int64()),
            "b": pa.array([r["b"] for r in rows], pa.float64()),
            "s": pa.array([r["s"] for r in rows], pa.string()),
            "flag": pa.array([r["flag"] for r in rows], pa.bool_()),
        }
    )
    kinds = {"a": "num", "b": "num", "s": "str", "flag": "bool"}
    try:
        results = [ref(tree, row, kinds) for row in rows]
        refused = results[0][0] not in ("bool", "null")
    except Refused:
        refused = True
    if refused:
        with pytest.raises(ExprError):
            mask(tree, table)
        return
    assert mask(tree, table).to_pylist() == [v is True for _k, v in results]


DETECTION = st.fixed_dictionaries(
    {"label": st.sampled_from(["A", "B", "C"]), "score": st.one_of(st.none(), st.floats(0, 1, allow_nan=False))}
)
LIST_ROWS = st.lists(st.one_of(st.none(), st.lists(DETECTION, max_size=4)), min_size=1, max_size=12)


def _reference(fn, values):
    """The row-by-row meaning: null list -> null; nulls inside are skipped by max/min/sum/mean."""
    if values is None:
        return None
    if fn == "count":
        return len(values)
    if fn == "any":
        return len(values) > 0
    present = [v for v in values if v is not None]
    if not values and fn == "sum":
        return 0.0
    if not present:  # SQL's rule: nothing but nulls sums to null
        return None
    if fn == "sum":
        return float(sum(present))
    return {"max": max, "min": min, "mean": lambda v: sum(v) / len(v)}[fn](present)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LIST_ROWS, st.sampled_from(["max", "min", "sum", "mean", "count", "any"]), st.sampled_from(["A", "B"]))
def test_list_filters_and_reductions_equal_a_row_by_row_reference(rows, fn, label):
    """``fn(d[label == X].score)`` (count/any: of the filtered list) per row equals Python's over
    the same lists: empty lists, null lists and null scores included."""
    kind = pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))
    table = pa.table({"nudenet.detections": pa.array(rows, kind)})
    target = "" if fn in ("count", "any") else ".score"
    got = evaluate(parse(f"{fn}(nudenet.detections[label == '{label}']{target})"), table).to_pylist()
    for row, value in zip(rows, got, strict=True):
        kept = None if row is None else [d for d in row if d["label"] == label]
        want = _reference(fn, kept if fn in ("count", "any") or kept is None else [d["score"] for d in kept])
        assert value == pytest.approx(want) if isinstance(want, float) else value == want, (row, value, want)


def test_a_dotted_name_reads_the_longest_column_then_fields_and_list_errors_are_named():
    kind = pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))
    table = pa.table(
        {"det.boxes": pa.array([[{"label": "A", "score": 0.7}, {"label": "B", "score": 0.9}]], kind), "det": [1]}
    )
    assert evaluate(parse("max(det.boxes.score)"), table).to_pylist() == [0.9]
    assert mask(parse("max(det.boxes[label != 'B'].score) > 0.6 and det == 1"), table).to_pylist() == [True]
    assert columns(parse("max(det.boxes[label == 'A'].score) > 0.6")) == {"det.boxes"}
    with pytest.raises(ExprError, match=r"no field 'size' \(the elements have label, score\)"):
        evaluate(parse("max(det.boxes.size)"), table)
    with pytest.raises(ExprError, match=r"max\(\) needs a list of numbers, got a list of string"):
        evaluate(parse("max(det.boxes.label)"), table)
    with pytest.raises(ExprError, match=r"a list is needed here, got int64"):
        evaluate(parse("count(det)"), table)
    with pytest.raises(ExprError, match=r"expected '\]' at 15"):
        parse("det.boxes[a > 1")
