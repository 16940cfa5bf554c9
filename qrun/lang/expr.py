"""Expression nodes: the safe subset of Python expressions (docs/language.md §6) shared by the AST
and the IR. Built by lang/build.py, checked by lang/compiler.py, evaluated by lang/evaluate.py.
Never Python eval: a template from an untrusted source cannot run code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qrun.source import Span


@dataclass(frozen=True, slots=True)
class Const:
    """A literal: str, int, float, bool or None."""

    value: Any
    span: Span


@dataclass(frozen=True, slots=True)
class Name:
    """A variable reference: an input, an earlier capture, a `set` variable or a loop variable."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Attr:
    """`obj.attr`; `attr` never starts with `_` (rejected at compile time). Evaluates as a dict
    key lookup for dicts and as the fields of `loop` (index, index0, first, last, length)."""

    obj: Expr
    attr: str
    span: Span


@dataclass(frozen=True, slots=True)
class Index:
    """`obj[index]`."""

    obj: Expr
    index: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Slice:
    """`obj[lower:upper:step]`; missing parts are None."""

    obj: Expr
    lower: Expr | None
    upper: Expr | None
    step: Expr | None
    span: Span


@dataclass(frozen=True, slots=True)
class ListExpr:
    """`[a, b, ...]`."""

    items: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class DictExpr:
    """`{k: v, ...}`."""

    items: tuple[tuple[Expr, Expr], ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Unary:
    """`-x`, `+x` or `not x` (op is "-", "+" or "not")."""

    op: str
    operand: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Binary:
    """Arithmetic: op in + - * / // % **."""

    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Compare:
    """A comparison chain `a < b <= c`: ops in == != < <= > >= in, "not in", is, "is not"."""

    left: Expr
    ops: tuple[str, ...]
    rights: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class BoolOp:
    """`a and b and ...` / `a or b or ...` (short-circuit, Python semantics)."""

    op: str
    values: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Cond:
    """`body if test else orelse`."""

    body: Expr
    test: Expr
    orelse: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Call:
    """A call of a stdlib function by name (`len(x)`); only names in the stdlib function list
    compile."""

    func: str
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Filter:
    """`value | name(args)`: the stdlib function `name` applied with `value` as first argument."""

    value: Expr
    name: str
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]
    span: Span


Expr = (
    Const | Name | Attr | Index | Slice | ListExpr | DictExpr | Unary | Binary | Compare
    | BoolOp | Cond | Call | Filter
)
