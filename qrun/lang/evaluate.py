"""Expression evaluation at run time: a small interpreter over lang/expr.py nodes (never Python
eval). Every failure is an EvaluationError at the failing node's span. Results are bounded in
size, and every node, and work that grows with a value's size, is charged to the run's Budget
(qrun/limits.py), so an untrusted template can neither exhaust memory nor run for long. Only
the stdlib functions below are ever called, never a value."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from qrun.errors import EvaluationError
from qrun.lang import expr as ex
from qrun.limits import (
    Budget,
    LimitExceeded,
    Limits,
    compare_cost,
    measure,
    raise_note,
    size_cost,
)
from qrun.source import Source, Span

MAX_RANGE = 100_000
"""range() yields at most this many items."""
MAX_SIZE = 10_000_000
"""Strings, lists and dicts built by an operator, a literal or a stdlib function hold at most
this many characters/items, counted through nested containers as if printed (`[[0] * 1000] *
1000` has size 1_001_000 although it shares one inner list). Inputs are not limited."""
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
        raise LimitExceeded(f"range() would have {len(items)} items (at most {MAX_RANGE})")
    return list(items)


def _join(items: Any, sep: Any = "") -> str:
    parts = [str(item) for item in items]
    glue = _str_arg(sep, "join")
    if sum(map(len, parts)) + len(glue) * max(0, len(parts) - 1) > MAX_SIZE:
        raise LimitExceeded(f"join() result would exceed {MAX_SIZE} characters")
    return glue.join(parts)


def _replace(value: Any, old: Any, new: Any, count: Any = -1) -> str:
    text, before, after = (_str_arg(v, "replace") for v in (value, old, new))
    hits = text.count(before) if before else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    if len(text) + hits * (len(after) - len(before)) > MAX_SIZE:
        raise LimitExceeded(f"replace() result would exceed {MAX_SIZE} characters")
    return text.replace(before, after, count)


def _split(value: Any, sep: Any = None, maxsplit: Any = -1) -> list[str]:
    return _str_arg(value, "split").split(sep, maxsplit)


def _strip(value: Any, chars: Any = None) -> str:
    return _str_arg(value, "strip").strip(chars)


def _round(value: Any, ndigits: Any = None) -> Any:
    if isinstance(ndigits, int) and abs(ndigits) > 100:
        raise LimitExceeded("round() takes at most 100 digits")
    return round(value) if ndigits is None else round(value, ndigits)


def _min(*args: Any) -> Any:
    return min(*args)


def _max(*args: Any) -> Any:
    return max(*args)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len,
    "range": _range,
    "int": int,
    "float": float,
    "str": str,
    "lower": lambda value: _str_arg(value, "lower").lower(),
    "upper": lambda value: _str_arg(value, "upper").upper(),
    "strip": _strip,
    "join": _join,
    "replace": _replace,
    "split": _split,
    "min": _min,
    "max": _max,
    "abs": abs,
    "round": _round,
}
"""The only functions a template can call, as `f(x, ...)` or as a filter `x | f(...)`. min and
max take positional arguments only: Python's `key=` would call a value."""
KEYWORDS: dict[str, tuple[str, ...]] = {
    "strip": ("chars",),
    "join": ("sep",),
    "replace": ("count",),
    "split": ("sep", "maxsplit"),
    "round": ("ndigits",),
}
"""The keyword arguments each function documents (docs/language.md); no other is accepted."""


def keyword_error(func: str, name: str) -> str | None:
    """Why `func(name=...)` is refused, or None when `name` is one of its keywords (shared by
    the compile-time check in lang/compiler.py and the evaluator)."""
    allowed = KEYWORDS.get(func, ())
    if name in allowed:
        return None
    takes = ", ".join(allowed) if allowed else "no keyword arguments"
    return f"{func}() has no keyword argument '{name}' (it takes {takes})"


# ---- the interpreter -----------------------------------------------------------------------------


def evaluate(expr: ex.Expr, scope: Mapping[str, Any], source: Source,
             budget: Budget | None = None) -> Any:
    """The value of `expr` with variables from `scope` (`loop` holds a LoopInfo in loops),
    charged to `budget` (the run's; a fresh default one when None).

    Raises:
        EvaluationError: at the span of the node that failed (undefined variable, missing key,
            type error, division by zero, a size limit, the budget running out ...).
    """
    return _Evaluator(scope, source, budget).eval(expr)


def evaluate_text(expr: ex.Expr, scope: Mapping[str, Any], source: Source,
                  budget: Budget | None = None) -> str:
    """`{{ expr }}` as text: a string as is, none as '', true/false, numbers as Python prints
    them, lists and dicts as JSON (a captured `json=` value reads as the JSON the model wrote;
    Python's repr where JSON cannot say it). A list or dict too large for the output left to
    the run is refused before it is converted.

    Raises:
        EvaluationError: as evaluate, or the value cannot be printed.
    """
    evaluator = _Evaluator(scope, source, budget)
    value = evaluator.eval(expr)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    try:
        if isinstance(value, list | tuple | Mapping):
            items, chars = measure(value)
            if not evaluator.budget.output_fits(items + chars):
                raise LimitExceeded("the value is too large to print (more than the "
                                    f"{evaluator.budget.output_left:,} characters of output "
                                    "left)", "output_chars")
            evaluator.budget.charge(size_cost(items, chars))
            try:
                return json.dumps(value, ensure_ascii=False)
            except (TypeError, ValueError):
                return str(value)
        return str(value)
    except LimitExceeded as exc:
        evaluator.limit(exc, expr.span)
    except (ValueError, RecursionError) as exc:  # an int past Python's 4300-digit str() limit
        evaluator.fail(f"cannot print the value: {_message(exc)}", expr.span)


class _Evaluator:
    def __init__(self, scope: Mapping[str, Any], source: Source, budget: Budget | None) -> None:
        self.scope = scope
        self.source = source
        self.budget = budget if budget is not None else Budget(Limits(), source)
        self.int_bits = self.budget.limits.int_bits

    def fail(self, message: str, span: Span, *notes: str) -> NoReturn:
        raise EvaluationError(message, span, self.source, notes)

    def limit(self, exc: LimitExceeded, span: Span) -> NoReturn:
        notes = [raise_note(exc.field)] if exc.field else []
        self.fail(str(exc), span, *notes)

    def eval(self, node: ex.Expr) -> Any:
        try:
            self.budget.charge(1)
            return self.dispatch(node)
        except EvaluationError:
            raise
        except LimitExceeded as exc:
            self.limit(exc, node.span)
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
                return self.built(self.slice(node))
            case ex.ListExpr(items=items):
                return self.built([self.eval(item) for item in items])
            case ex.DictExpr(items=items):
                return self.built({self.eval(k): self.eval(v) for k, v in items})
            case ex.Unary(op=op, operand=operand):
                return self.number(self.unary(op, self.eval(operand)))
            case ex.Binary(op=op, left=left, right=right):
                return self.binary(op, self.eval(left), self.eval(right))
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

    # ---- budget and size -------------------------------------------------------------------------

    def built(self, value: Any) -> Any:
        """A value an operation built: bounded by MAX_SIZE and charged by its size."""
        items, chars = measure(value)
        if items + chars > MAX_SIZE:
            raise LimitExceeded(f"value too large (more than {MAX_SIZE} items)")
        self.budget.charge(size_cost(items, chars))
        return value

    def read(self, value: Any) -> None:
        """Charge for an operation whose work grows with an operand's size."""
        self.budget.charge(size_cost(*measure(value)))

    def number(self, value: Any) -> Any:
        """Every integer an operation computes stays below 2**int_bits."""
        if type(value) is int and value.bit_length() > self.int_bits:
            raise LimitExceeded(f"integer too large (more than {self.int_bits} bits)",
                                "int_bits")
        return value

    # ---- nodes -------------------------------------------------------------------------------

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
                keys = ", ".join(repr(k) for _, k in zip(range(10), obj, strict=False))
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

    def binary(self, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            _check_repeat(left, right, self.int_bits)
        elif op == "**":
            _check_power(left, right, self.int_bits)
        elif op == "+" and isinstance(left, (str, list, tuple)):
            if _size(left) + _size(right) > MAX_SIZE:
                raise LimitExceeded(f"result would exceed {MAX_SIZE} items")
        elif op == "%" and not isinstance(left, (int, float)):
            raise TypeError(f"'%' needs numbers, not {_type(left)} (string formatting is not "
                            "supported)")
        result = _ARITHMETIC[op](left, right)
        if isinstance(result, complex):
            raise ValueError("the result is a complex number")
        if isinstance(result, (str, list)):
            return self.built(result)
        return self.number(result)

    def compare(self, node: ex.Compare) -> bool:
        left = self.eval(node.left)
        for op, right_node in zip(node.ops, node.rights, strict=True):
            right = self.eval(right_node)
            self.budget.charge(compare_cost(op, left, right))
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
        for name, _ in kwargs:
            refused = keyword_error(func, name)
            if refused is not None:
                self.fail(refused, span)
        named = {name: self.eval(value) for name, value in kwargs}
        values = [*args, *named.values()]
        if any(callable(value) for value in values):
            # Unreachable with plain inputs (lang/inputs.py); kept so no path calls a value.
            self.fail(f"a function cannot be an argument of {func}()", span)
        if func != "len":  # len is O(1); the others' work grows with their arguments
            for value in values:
                self.read(value)
        try:
            result = function(*args, **named)
        except LimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a stdlib call is the user's
            self.fail(f"{func}() failed: {_message(exc)}", span)
        if isinstance(result, (str, list)):
            return self.built(result)
        return self.number(result)


# ---- operators with size guards ------------------------------------------------------------------


def _check_repeat(left: Any, right: Any, int_bits: int) -> None:
    for seq, count in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
            if _size(seq) * max(count, 0) > MAX_SIZE:
                raise LimitExceeded(f"repetition would exceed {MAX_SIZE} items")
    if _is_int(left) and _is_int(right):
        if left.bit_length() + right.bit_length() > int_bits + 1:
            raise LimitExceeded(f"product would exceed 2**{int_bits}", "int_bits")


def _check_power(base: Any, exponent: Any, int_bits: int) -> None:
    if _is_int(base) and _is_int(exponent) and exponent > 0 and abs(base) > 1:
        if (abs(base).bit_length() - 1) * exponent > int_bits:
            raise LimitExceeded(f"power would exceed 2**{int_bits}", "int_bits")


def _size(value: Any) -> int:
    """Characters + items of a value as if printed (see limits.measure)."""
    items, chars = measure(value)
    return items + chars


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
