"""Expression nodes: the safe subset of Python expressions (docs/language.md §6) shared by the AST
and the IR. Built by lang/build.py, checked by lang/compiler.py, evaluated by lang/evaluate.py.
Never Python eval: a template from an untrusted source cannot run code."""

from __future__ import annotations

import json
from collections.abc import Iterator
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
    """Arithmetic: op in + - * / // % **, or `~` (both operands as text, joined)."""

    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Compare:
    """A comparison chain `a < b <= c`: ops in == != < <= > >= in, "not in"."""

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


@dataclass(frozen=True, slots=True)
class Test:
    """`value is name` or `value is not name` (`negated`): one of the stdlib tests
    (lang/builtins.py TESTS), binding like a filter, as in Jinja. `args` are the parenthesised
    arguments a Jinja test may take; no qrun test takes any (the compiler refuses them)."""

    value: Expr
    name: str
    args: tuple[Expr, ...]
    negated: bool
    span: Span


@dataclass(frozen=True, slots=True)
class Method:
    """`obj.name(args)`: only a dict's `items()`, `keys()` and `values()` compile; any other
    method call is refused with a hint (lang/surface.py)."""

    obj: Expr
    name: str
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]
    span: Span


Expr = (
    Const | Name | Attr | Index | Slice | ListExpr | DictExpr | Unary | Binary | Compare
    | BoolOp | Cond | Call | Filter | Test | Method
)


def children(node: Expr) -> Iterator[Expr]:
    """The sub-expressions of `node`, in source order."""
    match node:
        case Const() | Name():
            pass
        case Attr(obj=obj):
            yield obj
        case Index(obj=obj, index=index):
            yield from (obj, index)
        case Slice(obj=obj, lower=lower, upper=upper, step=step):
            yield obj
            yield from (p for p in (lower, upper, step) if p is not None)
        case ListExpr(items=items):
            yield from items
        case DictExpr(items=pairs):
            for key, value in pairs:
                yield from (key, value)
        case Unary(operand=operand):
            yield operand
        case Binary(left=left, right=right):
            yield from (left, right)
        case Compare(left=left, rights=rights):
            yield left
            yield from rights
        case BoolOp(values=values):
            yield from values
        case Cond(body=body, test=test, orelse=orelse):
            yield from (body, test, orelse)
        case Call(args=args, kwargs=kwargs):
            yield from args
            yield from (v for _, v in kwargs)
        case Filter(value=value, args=args, kwargs=kwargs) | Method(
                obj=value, args=args, kwargs=kwargs):
            yield value
            yield from args
            yield from (v for _, v in kwargs)
        case Test(value=value, args=args):
            yield value
            yield from args


def walk(node: Expr) -> Iterator[Expr]:
    """`node` and every expression below it, depth first, in source order."""
    yield node
    for child in children(node):
        yield from walk(child)


# ---- text: the deterministic form used by lang/ir_dump.py and the parser's golden tests --------


def format_expr(node: Expr) -> str:
    """Source-like text of an expression; operators are fully parenthesised, so the text shows
    exactly how the expression was parsed: `a + b * c` -> `(a + (b * c))`."""
    match node:
        case Const(value=value):
            return literal_text(value)
        case Name(name=name):
            return name
        case Attr(obj=obj, attr=attr):
            return f"{format_expr(obj)}.{attr}"
        case Index(obj=obj, index=index):
            return f"{format_expr(obj)}[{format_expr(index)}]"
        case Slice(obj=obj, lower=lower, upper=upper, step=step):
            parts = [format_expr(p) if p is not None else "" for p in (lower, upper, step)]
            inner = ":".join(parts if step is not None else parts[:2])
            return f"{format_expr(obj)}[{inner}]"
        case ListExpr(items=items):
            return "[" + ", ".join(format_expr(i) for i in items) + "]"
        case DictExpr(items=pairs):
            return "{" + ", ".join(f"{format_expr(k)}: {format_expr(v)}" for k, v in pairs) + "}"
        case Unary(op=op, operand=operand):
            space = " " if op == "not" else ""
            return f"({op}{space}{format_expr(operand)})"
        case Binary(op=op, left=left, right=right):
            return f"({format_expr(left)} {op} {format_expr(right)})"
        case Compare(left=left, ops=ops, rights=rights):
            tail = "".join(f" {op} {format_expr(r)}" for op, r in zip(ops, rights, strict=True))
            return f"({format_expr(left)}{tail})"
        case BoolOp(op=op, values=values):
            return "(" + f" {op} ".join(format_expr(v) for v in values) + ")"
        case Cond(body=body, test=test, orelse=orelse):
            return f"({format_expr(body)} if {format_expr(test)} else {format_expr(orelse)})"
        case Call(func=func, args=args, kwargs=kwargs):
            return f"{func}({_args(args, kwargs)})"
        case Filter(value=value, name=name, args=args, kwargs=kwargs):
            call = f"({_args(args, kwargs)})" if args or kwargs else ""
            return f"({format_expr(value)} | {name}{call})"
        case Test(value=value, name=name, args=args, negated=negated):
            called = f"{name}({_args(args, ())})" if args else name
            return f"({format_expr(value)} is {'not ' if negated else ''}{called})"
        case Method(obj=obj, name=name, args=args, kwargs=kwargs):
            return f"{format_expr(obj)}.{name}({_args(args, kwargs)})"
    raise TypeError(f"unknown expression {type(node).__name__}")


def _args(args: tuple[Expr, ...], kwargs: tuple[tuple[str, Expr], ...]) -> str:
    parts = [format_expr(a) for a in args]
    parts.extend(f"{name}={format_expr(value)}" for name, value in kwargs)
    return ", ".join(parts)


def literal_text(value: Any) -> str:
    """Strings in double quotes with JSON escapes (`"\\n"`); other constants as in Python."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)
