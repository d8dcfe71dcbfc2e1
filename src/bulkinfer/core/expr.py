"""A small, safe expression language over a table's columns, for routing rules
(``when = "proba_unsafe >= 0.8 and label != 'ok'"``) and gates. Parsed, never ``eval``-ed:
the grammar below is all it can do, and it runs vectorised on Arrow tables.

::

    expr  := and ("or" and)*
    and   := not ("and" not)*
    not   := "not" not | cmp
    cmp   := sum [("==" | "!=" | "<" | "<=" | ">" | ">=") sum]
           | sum "is" ["not"] "null"
           | sum ["not"] "in" "(" literal ("," literal)* ")"
    sum   := prod (("+" | "-") prod)*
    prod  := unary (("*" | "/") unary)*
    unary := "-" unary | post
    post  := atom ("[" expr "]" | "." name)*
    atom  := number | 'text' | "text" | true | false | null | column | `any column` | "(" expr ")"
           | func "(" expr ")"
    func  := max | min | sum | mean | count | any | all

Arithmetic is on doubles; comparisons with null are null, and a row whose condition is
null does not match (SQL's rule). Errors name the token and its position, or the column.

Lists (a detector's boxes, an OCR's lines) are read with three more forms: ``list[cond]``
keeps the elements of each row's list where ``cond`` holds (``cond`` names the fields of a
list of structs); ``list.field`` (or ``column.field`` where no column has that whole name)
is a field of each element; ``max``/``min``/``sum``/``mean`` of a list of numbers, ``count``
of a list (its elements), ``any``/``all`` of a list of true/false (of any other list:
whether it has an element) reduce each row's list to one value. An empty list's max, min
and mean are null, its sum and count 0, its any false and its all true::

    max(nudenet.detections[label in ('FEMALE_BREAST_EXPOSED', 'BUTTOCKS_EXPOSED')].score) > 0.6
    any(ocr.lines[confidence > 0.9]) and count(nudenet.detections) >= 2
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ConfigError

__all__ = ["FUNCTIONS", "Expr", "ExprError", "columns", "evaluate", "mask", "parse", "resolve_column", "to_text"]


class ExprError(ConfigError):
    """An expression that does not parse, or names a column or type that does not fit."""


@dataclass(frozen=True)
class Lit:
    value: Any  # int, float, str, bool or None


@dataclass(frozen=True)
class Col:
    name: str


@dataclass(frozen=True)
class Neg:
    arg: Expr


@dataclass(frozen=True)
class Not:
    arg: Expr


@dataclass(frozen=True)
class Bin:
    op: str  # or and == != < <= > >= + - * /
    left: Expr
    right: Expr


@dataclass(frozen=True)
class IsNull:
    arg: Expr
    negated: bool = False


@dataclass(frozen=True)
class In:
    arg: Expr
    values: tuple[Any, ...]
    negated: bool = False


@dataclass(frozen=True)
class Filter:
    arg: Expr
    cond: Expr


@dataclass(frozen=True)
class Field:
    arg: Expr
    name: str


@dataclass(frozen=True)
class Call:
    fn: str  # one of FUNCTIONS
    arg: Expr


Expr = Lit | Col | Neg | Not | Bin | IsNull | In | Filter | Field | Call
FUNCTIONS = ("max", "min", "sum", "mean", "count", "any", "all")

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)
      | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<quoted>`[^`]+`)
      | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<op>==|!=|<=|>=|<|>|\+|-|\*|/|\(|\)|,|\[|\]|\.)
    )""",
    re.X,
)
_KEYWORDS = {"and", "or", "not", "is", "null", "in", "true", "false"}
_CMP = ("==", "!=", "<", "<=", ">", ">=")


@dataclass(frozen=True)
class _Tok:
    kind: str  # num str col kw op end
    text: str
    pos: int
    value: Any = None


def _tokens(text: str, where: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            at = len(text) - len(text[pos:].lstrip())
            raise ExprError(f"{where}: unexpected {text[at]!r} at {at} in {text!r}")
        kind = m.lastgroup
        raw = m.group(kind)  # type: ignore[arg-type]
        at = m.start(kind)  # type: ignore[arg-type]
        if kind == "num":
            out.append(_Tok("num", raw, at, float(raw) if any(c in raw for c in ".eE") else int(raw)))
        elif kind == "str":
            out.append(_Tok("str", raw, at, re.sub(r"\\(.)", r"\1", raw[1:-1])))
        elif kind == "quoted":
            out.append(_Tok("col", raw, at, raw[1:-1]))
        elif kind == "name" and raw.lower() in _KEYWORDS:
            out.append(_Tok("kw", raw.lower(), at))
        elif kind == "name":
            out.append(_Tok("col", raw, at, raw))
        else:
            out.append(_Tok("op", raw, at))
        pos = m.end()
    out.append(_Tok("end", "end of text", len(text)))
    return out


class _Parser:
    def __init__(self, text: str, where: str) -> None:
        self.text, self.where = text, where
        self.toks = _tokens(text, where)
        self.i = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        if tok.kind == kind and (text is None or tok.text == text):
            self.i += 1
            return True
        return False

    def fail(self, expected: str) -> ExprError:
        tok = self.peek()
        return ExprError(f"{self.where}: expected {expected} at {tok.pos}, got {tok.text!r} in {self.text!r}")

    def expect(self, kind: str, text: str, what: str) -> None:
        if not self.accept(kind, text):
            raise self.fail(what)

    def parse(self) -> Expr:
        node = self.or_()
        if self.peek().kind != "end":
            raise self.fail("an operator or the end")
        return node

    def or_(self) -> Expr:
        node = self.and_()
        while self.accept("kw", "or"):
            node = Bin("or", node, self.and_())
        return node

    def and_(self) -> Expr:
        node = self.not_()
        while self.accept("kw", "and"):
            node = Bin("and", node, self.not_())
        return node

    def not_(self) -> Expr:
        if self.accept("kw", "not"):
            return Not(self.not_())
        return self.cmp()

    def cmp(self) -> Expr:
        left = self.sum()
        tok = self.peek()
        if tok.kind == "op" and tok.text in _CMP:
            self.take()
            return Bin(tok.text, left, self.sum())
        if self.accept("kw", "is"):
            negated = self.accept("kw", "not")
            self.expect("kw", "null", "null")
            return IsNull(left, negated)
        negated = self.accept("kw", "not")
        if self.accept("kw", "in"):
            self.expect("op", "(", "'('")
            values = [self.literal()]
            while self.accept("op", ","):
                values.append(self.literal())
            self.expect("op", ")", "',' or ')'")
            return In(left, tuple(values), negated)
        if negated:
            raise self.fail("in")
        return left

    def sum(self) -> Expr:
        node = self.prod()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            node = Bin(self.take().text, node, self.prod())
        return node

    def prod(self) -> Expr:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/"):
            node = Bin(self.take().text, node, self.unary())
        return node

    def unary(self) -> Expr:
        if self.accept("op", "-"):
            return Neg(self.unary())
        return self.post()

    def post(self) -> Expr:
        node = self.atom()
        while True:
            if self.accept("op", "["):
                node = Filter(node, self.or_())
                self.expect("op", "]", "']'")
            elif self.accept("op", "."):
                tok = self.take()
                if tok.kind != "col" or tok.text.startswith("`"):
                    self.i -= 1
                    raise self.fail("a field name after '.'")
                node = _fields(node, tok.value)
            else:
                return node

    def literal(self) -> Any:
        tok = self.peek()
        node = self.unary()
        if isinstance(node, Neg) and isinstance(node.arg, Lit) and isinstance(node.arg.value, int | float):
            return -node.arg.value
        if not isinstance(node, Lit):
            raise ExprError(f"{self.where}: expected a literal at {tok.pos}, got {tok.text!r} in {self.text!r}")
        return node.value

    def atom(self) -> Expr:
        tok = self.take()
        if tok.kind in ("num", "str"):
            return Lit(tok.value)
        if tok.kind == "col" and tok.value.lower() in FUNCTIONS and self.accept("op", "("):
            call = Call(tok.value.lower(), self.or_())
            self.expect("op", ")", "')'")
            return call
        if tok.kind == "col":
            return Col(tok.value)
        if tok.kind == "kw" and tok.text in ("true", "false"):
            return Lit(tok.text == "true")
        if tok.kind == "kw" and tok.text == "null":
            return Lit(None)
        if tok.kind == "op" and tok.text == "(":
            node = self.or_()
            self.expect("op", ")", "')'")
            return node
        self.i -= 1
        raise self.fail("a value, a column or '('")


def _fields(node: Expr, path: str) -> Expr:
    for name in path.split("."):
        node = Field(node, name)
    return node


def parse(text: str, where: str = "expression") -> Expr:
    """The expression ``text`` as a tree; :class:`ExprError` names the token and its position."""
    return _Parser(text, where).parse()


def _lit_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def to_text(node: Expr) -> str:
    """Canonical text of a tree (every compound part in parentheses); ``parse(to_text(e)) == e``."""
    if isinstance(node, Lit):
        negative = isinstance(node.value, int | float) and not isinstance(node.value, bool) and node.value < 0
        return f"({_lit_text(node.value)})" if negative else _lit_text(node.value)
    if isinstance(node, Col):
        plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", node.name) and node.name.lower() not in _KEYWORDS
        return node.name if plain else f"`{node.name}`"
    if isinstance(node, Neg):
        return f"(-{to_text(node.arg)})"
    if isinstance(node, Not):
        return f"(not {to_text(node.arg)})"
    if isinstance(node, IsNull):
        return f"({to_text(node.arg)} is {'not ' if node.negated else ''}null)"
    if isinstance(node, In):
        values = ", ".join(_lit_text(v) for v in node.values)
        return f"({to_text(node.arg)} {'not ' if node.negated else ''}in ({values}))"
    if isinstance(node, Filter):
        return f"({to_text(node.arg)}[{to_text(node.cond)}])"
    if isinstance(node, Field):
        return f"(({to_text(node.arg)}).{node.name})"
    if isinstance(node, Call):
        return f"{node.fn}({to_text(node.arg)})"
    return f"({to_text(node.left)} {node.op} {to_text(node.right)})"


def columns(node: Expr) -> set[str]:
    """The columns ``node`` reads."""
    if isinstance(node, Col):
        return {node.name}
    if isinstance(node, Lit):
        return set()
    if isinstance(node, Bin):
        return columns(node.left) | columns(node.right)
    return columns(node.arg)  # a filter's condition names the elements' fields, not columns


_ARITH = {"+": pc.add, "-": pc.subtract, "*": pc.multiply, "/": pc.divide}
_COMPARE = {
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def evaluate(node: Expr, table: pa.Table, where: str = "expression") -> pa.ChunkedArray | pa.Array | pa.Scalar:
    """The value of ``node`` for every row of ``table`` (an Arrow array, or a scalar for a constant)."""
    if isinstance(node, Lit):
        return pa.scalar(node.value)
    if isinstance(node, Col):
        return _column(node.name, table, where)
    try:
        if isinstance(node, Filter | Field | Call):
            return _list_op(node, table, where)
        if isinstance(node, Neg):
            return pc.negate(_number(evaluate(node.arg, table, where)))
        if isinstance(node, Not):
            return pc.invert(_bool(evaluate(node.arg, table, where), where))
        if isinstance(node, IsNull):
            value = evaluate(node.arg, table, where)
            nulls = pc.is_null(value, nan_is_null=False)
            return pc.invert(nulls) if node.negated else nulls
        if isinstance(node, In):
            return _is_in(evaluate(node.arg, table, where), pa.array(node.values), node.negated)
        left, right = evaluate(node.left, table, where), evaluate(node.right, table, where)
        if node.op == "and":
            return pc.and_kleene(_bool(left, where), _bool(right, where))
        if node.op == "or":
            return pc.or_kleene(_bool(left, where), _bool(right, where))
        if node.op in _ARITH:
            return _ARITH[node.op](_number(left), _number(right))
        return _COMPARE[node.op](*_comparable(left, right))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ExprError(f"{where}: {to_text(node)}: {' '.join(str(exc).split())[:200]}") from None


def resolve_column(name: str, names: Iterable[str]) -> str | None:
    """The column a name reads: itself, else its longest dotted prefix that is a column (the
    rest are fields of its elements: ``nudenet.detections.score``); None when neither is."""
    names = set(names)
    parts = name.split(".")
    return next((c for c in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if c in names), None)


def _column(name: str, table: pa.Table, where: str) -> Any:
    found = resolve_column(name, table.column_names)
    if found is None:
        raise ExprError(f"{where}: no column {name!r} (the rows have {', '.join(table.column_names)})")
    value = table.column(found).combine_chunks()
    for field in name[len(found) + 1 :].split(".") if found != name else []:
        value = _field(value, field)
    return value


def _field(value: Any, name: str) -> Any:
    """Field ``name`` of a struct column, or of each element of a list of structs."""
    if pa.types.is_list(value.type) or pa.types.is_large_list(value.type):
        flat, parents, n, nulls = _flat(value)
        return _relist(_field(flat, name), parents, n, nulls)
    if not pa.types.is_struct(value.type):
        raise pa.ArrowTypeError(f"no field {name!r} in {value.type}")
    if value.type.get_field_index(name) < 0:
        fields = ", ".join(value.type.field(i).name for i in range(value.type.num_fields))
        raise pa.ArrowTypeError(f"no field {name!r} (the elements have {fields})")
    return pc.struct_field(value, name)


def _flat(value: Any) -> tuple[pa.Array, np.ndarray, int, pa.Array]:
    """A list column's elements, the row of each, the number of rows and the null rows."""
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if not (pa.types.is_list(value.type) or pa.types.is_large_list(value.type)):
        raise pa.ArrowTypeError(f"a list is needed here, got {value.type}")
    parents = pc.list_parent_indices(value).to_numpy(zero_copy_only=False)
    return pc.list_flatten(value), parents, len(value), pc.is_null(value)


def _relist(flat: pa.Array, parents: np.ndarray, n: int, nulls: pa.Array) -> pa.Array:
    """Elements back into one list per row (``parents``: the row of each, in order)."""
    offsets = np.concatenate([[0], np.cumsum(np.bincount(parents, minlength=n))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=nulls)


def _list_op(node: Filter | Field | Call, table: pa.Table, where: str) -> Any:
    if isinstance(node, Field):
        return _field(evaluate(node.arg, table, where), node.name)
    flat, parents, n, nulls = _flat(evaluate(node.arg, table, where))
    if isinstance(node, Filter):
        if not pa.types.is_struct(flat.type):
            raise pa.ArrowTypeError(f"[...] filters a list of structs (fields by name), got a list of {flat.type}")
        keep = mask(node.cond, pa.Table.from_struct_array(flat), where)
        return _relist(flat.filter(keep), parents[keep.to_numpy(zero_copy_only=False)], n, nulls)
    return _reduce(node.fn, flat, parents, n, nulls)


_EMPTY = {"sum": 0.0, "any": False, "all": True}
"""An empty list's value (max, min and mean of nothing: null)."""


def _reduce(fn: str, flat: pa.Array, parents: np.ndarray, n: int, nulls: pa.Array) -> pa.Array:
    """``fn`` of each row's list: null for a null list, ``_EMPTY`` (or null) for an empty one."""
    if fn == "count" or (fn == "any" and not pa.types.is_boolean(flat.type)):
        counts = pa.array(np.bincount(parents, minlength=n).astype(np.int64))
        value = counts if fn == "count" else pc.greater(counts, 0)
        return pc.if_else(nulls, pa.scalar(None, value.type), value)
    if fn in ("any", "all") and not pa.types.is_boolean(flat.type):
        raise pa.ArrowTypeError(f"all() needs a list of true/false, got a list of {flat.type}")
    if fn in ("max", "min", "sum", "mean") and not _numeric(flat.type):
        raise pa.ArrowTypeError(f"{fn}() needs a list of numbers, got a list of {flat.type}")
    out_type = pa.bool_() if fn in ("any", "all") else pa.float64()
    values = flat if fn in ("any", "all") else pc.cast(flat, pa.float64())
    grouped = pa.table({"row": pa.array(parents, pa.int64()), "v": values}).group_by("row").aggregate([("v", fn)])
    at = np.full(n, -1, dtype=np.int64)  # each row's place in the grouped values (-1: an empty list)
    at[grouped.column("row").to_numpy()] = np.arange(grouped.num_rows)
    found = grouped.column(f"v_{fn}").combine_chunks().cast(out_type)
    taken = found.take(pa.array(np.where(at < 0, 0, at))) if grouped.num_rows else pa.nulls(n, out_type)
    empty = pa.scalar(_EMPTY.get(fn), out_type)
    value = pc.if_else(pa.array(at < 0), empty, taken)
    return pc.if_else(nulls, pa.scalar(None, out_type), value)


def mask(node: Expr, table: pa.Table, where: str = "expression") -> pa.Array:
    """The rows where ``node`` is true (null counts as false), as a boolean array."""
    value = evaluate(node, table, where)
    if isinstance(value, pa.Scalar):
        value = pa.array([value.as_py()] * table.num_rows, pa.bool_() if value.type == pa.null() else value.type)
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if not (pa.types.is_boolean(value.type) or pa.types.is_null(value.type)):
        raise ExprError(f"{where}: {to_text(node)} is {value.type}, not true/false; compare it with something")
    return pc.fill_null(value.cast(pa.bool_()), False)


def _is_in(value: Any, values: pa.Array, negated: bool) -> Any:
    if pa.types.is_null(value.type):
        return pc.cast(value, pa.bool_())
    if _numeric(value.type) and _numeric(values.type):  # as doubles, -0.0 as 0.0 (they are equal)
        value = pc.add(pc.cast(value, pa.float64()), 0.0)
        values = pc.add(pc.cast(values, pa.float64()), 0.0)
    elif value.type != values.type:
        raise pa.ArrowTypeError(f"cannot look for {values.type} values in {value.type}")
    found = pc.is_in(value, value_set=values)
    found = pc.if_else(pc.is_null(value), pa.scalar(None, pa.bool_()), found)
    return pc.invert(found) if negated else found


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


def _number(value: Any) -> Any:
    t = value.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t):
        return pc.cast(value, pa.float64())
    raise pa.ArrowTypeError(f"arithmetic needs numbers, got {t}")


def _bool(value: Any, where: str) -> Any:
    t = value.type
    if pa.types.is_boolean(t) or pa.types.is_null(t):
        return pc.cast(value, pa.bool_())
    raise pa.ArrowTypeError(f"and/or/not need true/false, got {t}")


def _comparable(left: Any, right: Any) -> tuple[Any, Any]:
    """Numbers compare as doubles; otherwise both sides must be of one kind."""
    if _numeric(left.type) and _numeric(right.type):
        return pc.cast(left, pa.float64()), pc.cast(right, pa.float64())
    if any(pa.types.is_null(v.type) for v in (left, right)):
        other = right if pa.types.is_null(left.type) else left
        kind = pa.bool_() if pa.types.is_null(other.type) else other.type
        return pc.cast(left, kind), pc.cast(right, kind)
    if left.type != right.type and not (pa.types.is_string(left.type) and pa.types.is_string(right.type)):
        raise pa.ArrowTypeError(f"cannot compare {left.type} with {right.type}")
    return left, right
