"""Expression evaluation at run time: a small interpreter over lang/expr.py nodes (never Python
eval). Every failure is an EvaluationError at the failing node's span, and results are bounded
in size so an untrusted template cannot exhaust memory."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from qrun.errors import EvaluationError
from qrun.lang import expr as ex
from qrun.source import Source, Span

MAX_RANGE = 100_000
"""range() yields at most this many items."""
MAX_SIZE = 10_000_000
"""Strings, lists and dicts built by an operator, a literal or a stdlib function hold at most
this many characters/items, counted through nested containers as if printed (`[[0] * 1000] *
1000` has size 1_001_000 although it shares one inner list). Inputs are not limited."""
MAX_INT_BITS = 10_000
"""Integers built by an expression stay below 2**10000 (about 3000 digits)."""


@dataclass(frozen=True, slots=True)
class LoopInfo:
    """What the runtime binds to `loop` inside a `for` body: iteration `index0` (0-based) of
    `length`. Templates read `loop.index` (1-based), `loop.index0`, `loop.first`, `loop.last`,
    `loop.length`, `loop.revindex` (1-based, counting down) and `loop.revindex0`."""

    index0: int
    length: int

    @property
    def index(self) -> int:
        return self.index0 + 1

    @property
    def first(self) -> bool:
        return self.index0 == 0

    @property
    def last(self) -> bool:
        return self.index0 == self.length - 1

    @property
    def revindex(self) -> int:
        return self.length - self.index0

    @property
    def revindex0(self) -> int:
        return self.length - self.index0 - 1


LOOP_FIELDS = ("index", "index0", "first", "last", "length", "revindex", "revindex0")


class _Limit(ValueError):
    """A size limit was hit; becomes an EvaluationError at the node being evaluated."""


# ---- stdlib functions (docs/language.md §6): string functions take the string first ----------


def _str_arg(value: Any, func: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{func}() expects a string, got {_type(value)}")
    return value


def _range(*args: Any) -> list[int]:
    if not all(isinstance(a, int) for a in args):
        raise TypeError("range() expects integers")
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise _Limit(f"range() would have {len(items)} items (at most {MAX_RANGE})")
    return list(items)


def _join(items: Any, sep: Any = "") -> str:
    parts = [str(_check_size(item)) for item in items]
    glue = _str_arg(sep, "join")
    if sum(map(len, parts)) + len(glue) * max(0, len(parts) - 1) > MAX_SIZE:
        raise _Limit(f"join() result would exceed {MAX_SIZE} characters")
    return glue.join(parts)


def _replace(value: Any, old: Any, new: Any, count: Any = -1) -> str:
    text, before, after = (_str_arg(v, "replace") for v in (value, old, new))
    hits = text.count(before) if before else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    if len(text) + hits * (len(after) - len(before)) > MAX_SIZE:
        raise _Limit(f"replace() result would exceed {MAX_SIZE} characters")
    return text.replace(before, after, count)


def _split(value: Any, sep: Any = None, maxsplit: Any = -1) -> list[str]:
    return _str_arg(value, "split").split(sep, maxsplit)


def _strip(value: Any, chars: Any = None) -> str:
    return _str_arg(value, "strip").strip(chars)


def _round(value: Any, ndigits: Any = None) -> Any:
    if isinstance(ndigits, int) and abs(ndigits) > 100:
        raise _Limit("round() takes at most 100 digits")
    return round(value) if ndigits is None else round(value, ndigits)


def _str(value: Any) -> str:
    return str(_check_size(value))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len,
    "range": _range,
    "int": int,
    "float": float,
    "str": _str,
    "lower": lambda value: _str_arg(value, "lower").lower(),
    "upper": lambda value: _str_arg(value, "upper").upper(),
    "strip": _strip,
    "join": _join,
    "replace": _replace,
    "split": _split,
    "min": min,
    "max": max,
    "abs": abs,
    "round": _round,
}
"""The only functions a template can call, as `f(x, ...)` or as a filter `x | f(...)`."""


# ---- the interpreter -----------------------------------------------------------------------------


def evaluate(expr: ex.Expr, scope: Mapping[str, Any], source: Source) -> Any:
    """The value of `expr` with variables from `scope` (`loop` holds a LoopInfo in loops).

    Raises:
        EvaluationError: at the span of the node that failed (undefined variable, missing key,
            type error, division by zero, a size limit ...).
    """
    return _Evaluator(scope, source).eval(expr)


class _Evaluator:
    def __init__(self, scope: Mapping[str, Any], source: Source) -> None:
        self.scope = scope
        self.source = source

    def fail(self, message: str, span: Span) -> NoReturn:
        raise EvaluationError(message, span, self.source)

    def eval(self, node: ex.Expr) -> Any:
        try:
            return self.dispatch(node)
        except EvaluationError:
            raise
        except _Limit as exc:
            self.fail(str(exc), node.span)
        except (ArithmeticError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                RecursionError, MemoryError) as exc:
            self.fail(_message(exc), node.span)

    def dispatch(self, node: ex.Expr) -> Any:
        match node:
            case ex.Const(value=value):
                return value
            case ex.Name(name=name):
                return self.name(name, node.span)
            case ex.Attr(obj=obj, attr=attr):
                return self.attr(self.eval(obj), attr, node.span)
            case ex.Index(obj=obj, index=index):
                return self.index(self.eval(obj), self.eval(index), node.span)
            case ex.Slice():
                return self.slice(node)
            case ex.ListExpr(items=items):
                return _check_size([self.eval(item) for item in items])
            case ex.DictExpr(items=items):
                return _check_size({self.eval(k): self.eval(v) for k, v in items})
            case ex.Unary(op=op, operand=operand):
                return self.unary(op, self.eval(operand))
            case ex.Binary(op=op, left=left, right=right):
                return _binary(op, self.eval(left), self.eval(right))
            case ex.Compare():
                return self.compare(node)
            case ex.BoolOp():
                return self.bool_op(node)
            case ex.Cond(body=body, test=test, orelse=orelse):
                return self.eval(body) if self.eval(test) else self.eval(orelse)
            case ex.Call(func=func, args=args, kwargs=kwargs):
                return self.call(func, [self.eval(a) for a in args], kwargs, node.span)
            case ex.Filter(value=value, name=name, args=args, kwargs=kwargs):
                values = [self.eval(value), *(self.eval(a) for a in args)]
                return self.call(name, values, kwargs, node.span)
        raise TypeError(f"unknown expression node {type(node).__name__}")

    def name(self, name: str, span: Span) -> Any:
        if name.startswith("_"):
            self.fail(f"names starting with '_' are not allowed: '{name}'", span)
        if name not in self.scope:
            self.fail(f"undefined variable '{name}'", span)
        return self.scope[name]

    def attr(self, obj: Any, attr: str, span: Span) -> Any:
        if attr.startswith("_"):
            self.fail(f"attributes starting with '_' are not allowed: '{attr}'", span)
        if isinstance(obj, LoopInfo) and attr in LOOP_FIELDS:
            return getattr(obj, attr)
        if isinstance(obj, Mapping):
            if attr not in obj:
                keys = ", ".join(repr(k) for k in list(obj)[:10])
                self.fail(f"key '{attr}' not found (keys: {keys or 'none'})", span)
            return obj[attr]
        self.fail(f"a {_type(obj)} value has no attribute '{attr}'", span)

    def index(self, obj: Any, index: Any, span: Span) -> Any:
        if isinstance(obj, Mapping):
            if index not in obj:
                self.fail(f"key {index!r} not found", span)
            return obj[index]
        if not isinstance(obj, (list, tuple, str, range)):
            self.fail(f"a {_type(obj)} value cannot be indexed", span)
        if not isinstance(index, int):
            self.fail(f"a {_type(obj)} index must be an integer, not {_type(index)}", span)
        if not -len(obj) <= index < len(obj):
            self.fail(f"index {index} out of range (length {len(obj)})", span)
        return obj[index]

    def slice(self, node: ex.Slice) -> Any:
        obj = self.eval(node.obj)
        parts = [None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)]
        if not isinstance(obj, (list, tuple, str, range)):
            self.fail(f"a {_type(obj)} value cannot be sliced", node.span)
        if any(p is not None and not isinstance(p, int) for p in parts):
            self.fail("slice bounds must be integers", node.span)
        if parts[2] == 0:
            self.fail("slice step cannot be zero", node.span)
        return obj[parts[0]:parts[1]:parts[2]]

    def unary(self, op: str, value: Any) -> Any:
        if op == "not":
            return not value
        if not isinstance(value, (int, float)):
            raise TypeError(f"bad operand for unary {op}: {_type(value)}")
        return -value if op == "-" else +value

    def compare(self, node: ex.Compare) -> bool:
        left = self.eval(node.left)
        for op, right_node in zip(node.ops, node.rights, strict=True):
            right = self.eval(right_node)
            if not _COMPARE[op](left, right):
                return False
            left = right
        return True

    def bool_op(self, node: ex.BoolOp) -> Any:
        value: Any = None
        for item in node.values:
            value = self.eval(item)
            if (node.op == "and") != bool(value):
                return value
        return value

    def call(self, func: str, args: list[Any], kwargs: tuple[tuple[str, ex.Expr], ...],
             span: Span) -> Any:
        function = FUNCTIONS.get(func)
        if function is None:
            self.fail(f"unknown function '{func}'", span)
        named = {name: self.eval(value) for name, value in kwargs}
        try:
            return function(*args, **named)
        except _Limit:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a stdlib call is the user's
            self.fail(f"{func}() failed: {_message(exc)}", span)


# ---- operators with size guards ------------------------------------------------------------------


def _binary(op: str, left: Any, right: Any) -> Any:
    if op == "*":
        _check_repeat(left, right)
    elif op == "**":
        _check_power(left, right)
    elif op == "+" and isinstance(left, (str, list, tuple)):
        if _size(left) + _size(right) > MAX_SIZE:
            raise _Limit(f"result would exceed {MAX_SIZE} items")
    elif op == "%" and not isinstance(left, (int, float)):
        raise TypeError(f"'%' needs numbers, not {_type(left)} (string formatting is not "
                        "supported)")
    result = _ARITHMETIC[op](left, right)
    if isinstance(result, complex):
        raise ValueError("the result is a complex number")
    return result


def _check_repeat(left: Any, right: Any) -> None:
    for seq, count in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
            if _size(seq) * max(count, 0) > MAX_SIZE:
                raise _Limit(f"repetition would exceed {MAX_SIZE} items")
    if _is_int(left) and _is_int(right):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _Limit(f"product would exceed 2**{MAX_INT_BITS}")


def _check_power(base: Any, exponent: Any) -> None:
    if _is_int(base) and _is_int(exponent) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS:
            raise _Limit(f"power would exceed 2**{MAX_INT_BITS}")


def _check_size(value: Any) -> Any:
    if _size(value) > MAX_SIZE:
        raise _Limit(f"value too large (more than {MAX_SIZE} items)")
    return value


def _size(value: Any) -> int:
    """Characters/items in a value as if printed: nested containers are counted every time
    they occur, but each distinct container is visited once (memo by id), so shared structure
    such as `[[x] * 1000] * 1000` costs O(distinct containers) to measure."""
    memo: dict[int, int] = {}

    def measure(item: Any, depth: int) -> int:
        if isinstance(item, str):
            return len(item)
        if _is_int(item):
            if item.bit_length() > MAX_INT_BITS:
                raise _Limit(f"integer too large (more than {MAX_INT_BITS} bits)")
            return 1
        if not isinstance(item, (list, tuple, Mapping)):
            return 1
        if id(item) in memo:
            return memo[id(item)]
        if depth > 200:
            raise _Limit("value nested too deeply (more than 200 levels)")
        children = item.items() if isinstance(item, Mapping) else ((v, None) for v in item)
        total = len(item) + sum(measure(k, depth + 1) + (0 if v is None else
                                measure(v, depth + 1)) for k, v in children)
        memo[id(item)] = total
        return total

    return measure(value, 0)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type(value: Any) -> str:
    return {str: "string", int: "int", float: "float", bool: "bool", list: "list",
            dict: "dict", tuple: "tuple", type(None): "None"}.get(type(value),
                                                                  type(value).__name__)


def _message(exc: BaseException) -> str:
    if isinstance(exc, ZeroDivisionError):
        return "division by zero"
    if isinstance(exc, RecursionError):
        return "value nested too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory"
    return str(exc) or type(exc).__name__


def _not_in(a: Any, b: Any) -> bool:
    return a not in b


def _in(a: Any, b: Any) -> bool:
    return a in b


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge, "in": _in, "not in": _not_in,
    "is": operator.is_, "is not": operator.is_not,
}
