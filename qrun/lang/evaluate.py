"""Expression evaluation at run time: a small interpreter over lang/expr.py nodes (never Python
eval). Every failure is an EvaluationError at the failing node's span. Results are bounded in
size, and every node, and work that grows with a value's size, is charged to the run's Budget
(qrun/limits.py), so an untrusted template can neither exhaust memory nor run for long. Only
the stdlib functions of lang/builtins.py are ever called, never a value; the runtime may
add the template's macros and the host functions its caller registered (`calls`, a Calls),
which the stdlib's names shadow. An undefined value
(a missing variable, key or item) is an error except where `is defined`, `is undefined` and
`default` look at it (Jinja's StrictUndefined)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from qrun.errors import EvaluationError, LimitError, QrunError
from qrun.lang import expr as ex
from qrun.lang.builtins import (
    CONSTANT_TIME,
    EXTRA_COSTS,
    FUNCTIONS,
    MAX_SIZE,
    METHODS,
    PASS_THROUGH,
    TESTS,
    UNDEFINED_TESTS,
    Undefined,
    keyword_error,
    text_of,
    type_name,
)
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
HOLE_ENDING_FIELDS = ("finish", "stop", "text")
"""What `holes.NAME` holds for a hole that ended (docs/language.md §7.6; runtime/executor.py
builds it)."""


def refused_name(name: str) -> str | None:
    """Why a template may not use or make the name `name` (it could reach Python's internals,
    or become an input spelled so: docs/language.md §5), or None."""
    if name.startswith("_") or "__" in name:
        return f"names starting with '_' or containing '__' are not allowed: '{name}'"
    return None


class Calls(Protocol):
    """The functions a run adds to the stdlib (runtime/calls.py): macros, host functions and
    run_tool. Called with plain values; the result is plain data."""

    def __contains__(self, name: object) -> bool: ...

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        """The value of `name(*args, **kwargs)` called at `span` (of the run's current source).

        Raises:
            EvaluationError: at `span` (or inside a macro, with a note naming `span`).
        """
        ...


# ---- the interpreter -----------------------------------------------------------------------------


def evaluate(expr: ex.Expr, scope: Mapping[str, Any], source: Source,
             budget: Budget | None = None, calls: Calls | None = None) -> Any:
    """The value of `expr` with variables from `scope` (`loop` holds a LoopInfo in loops),
    charged to `budget` (the run's; a fresh default one when None).

    Raises:
        EvaluationError: at the span of the node that failed (undefined variable, missing key,
            type error, division by zero, a size limit, the budget running out ...).
    """
    return _Evaluator(scope, source, budget, calls).eval(expr)


def evaluate_text(expr: ex.Expr, scope: Mapping[str, Any], source: Source,
                  budget: Budget | None = None, calls: Calls | None = None) -> str:
    """`{{ expr }}` as text: a string as is, none as '', true/false, numbers as Python prints
    them, lists and dicts as JSON (a captured `json=` value reads as the JSON the model wrote;
    Python's repr where JSON cannot say it). A list or dict too large for the output left to
    the run is refused before it is converted.

    Raises:
        EvaluationError: as evaluate, or the value cannot be printed.
    """
    evaluator = _Evaluator(scope, source, budget, calls)
    value = evaluator.eval(expr)
    try:
        if isinstance(value, list | tuple | Mapping):
            items, chars = measure(value)
            if not evaluator.budget.output_fits(items + chars):
                raise LimitExceeded("the value is too large to print (more than the "
                                    f"{evaluator.budget.output_left:,} characters of output "
                                    "left)", "output_chars")
            evaluator.budget.charge(size_cost(items, chars))
        return text_of(value)
    except LimitExceeded as exc:
        evaluator.limit(exc, expr.span)
    except (ValueError, RecursionError) as exc:  # an int past Python's 4300-digit str() limit
        evaluator.fail(f"cannot print the value: {_message(exc)}", expr.span)


class _Evaluator:
    def __init__(self, scope: Mapping[str, Any], source: Source, budget: Budget | None,
                 calls: Calls | None = None) -> None:
        self.scope = scope
        self.source = source
        self.calls = calls
        self.budget = budget if budget is not None else Budget(Limits(), source)
        self.int_bits = self.budget.limits.int_bits

    def fail(self, message: str, span: Span, *notes: str) -> NoReturn:
        raise EvaluationError(message, span, self.source, notes)

    def limit(self, exc: LimitExceeded, span: Span) -> NoReturn:
        if exc.field is None:  # a fixed size limit: an error of the template's values
            self.fail(str(exc), span)
        raise LimitError(str(exc), span, self.source, [raise_note(exc.field)])

    def eval(self, node: ex.Expr, lenient: bool = False) -> Any:
        """The value of `node`; an undefined one is an error unless `lenient` (the operand of
        `is defined`, `is undefined` or `default`), where it comes back as an Undefined."""
        try:
            self.budget.charge(1)
            value = self.dispatch(node, lenient)
        except EvaluationError:
            raise
        except LimitExceeded as exc:
            self.limit(exc, node.span)
        except (ArithmeticError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                RecursionError, MemoryError) as exc:
            self.fail(_message(exc), node.span)
        if isinstance(value, Undefined) and not lenient:
            self.fail(value.reason, node.span)
        return value

    def dispatch(self, node: ex.Expr, lenient: bool = False) -> Any:
        match node:
            case ex.Const(value=value):
                return value
            case ex.Name(name=name):
                return self.name(name, node.span, lenient)
            case ex.Attr(obj=obj, attr=attr):
                return self.attr(self.eval(obj), attr, node.span, lenient)
            case ex.Index(obj=obj, index=index):
                return self.index(self.eval(obj), self.eval(index), node.span, lenient)
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
                return self.call(func, self.arguments(func, args), kwargs, node.span)
            case ex.Filter(value=value, name=name, args=args, kwargs=kwargs):
                return self.call(name, self.arguments(name, (value, *args)), kwargs, node.span)
            case ex.Test(value=value, name=name, negated=negated):
                tested = self.eval(value, lenient=name in UNDEFINED_TESTS)
                return TESTS[name](tested) != negated
            case ex.Method(obj=obj, name=name):
                return self.method(self.eval(obj), name, node.span)
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

    def name(self, name: str, span: Span, lenient: bool = False) -> Any:
        refused = refused_name(name)
        if refused is not None:
            self.fail(refused, span)
        if name not in self.scope:
            return self.undefined(f"undefined variable '{name}'", span, lenient)
        return self.scope[name]

    def attr(self, obj: Any, attr: str, span: Span, lenient: bool = False) -> Any:
        if attr.startswith("_"):
            self.fail(f"attributes starting with '_' are not allowed: '{attr}'", span)
        if isinstance(obj, LoopInfo) and attr in LOOP_FIELDS:
            return getattr(obj, attr)
        if isinstance(obj, Mapping):
            if attr not in obj:
                keys = ", ".join(repr(k) for _, k in zip(range(10), obj, strict=False))
                return self.undefined(f"key '{attr}' not found (keys: {keys or 'none'})", span,
                                      lenient)
            return obj[attr]
        return self.undefined(f"a {type_name(obj)} value has no attribute '{attr}'", span,
                              lenient)

    def index(self, obj: Any, index: Any, span: Span, lenient: bool = False) -> Any:
        if isinstance(obj, Mapping):
            if index not in obj:
                return self.undefined(f"key {index!r} not found", span, lenient)
            return obj[index]
        if not isinstance(obj, (list, tuple, str, range)):
            self.fail(f"a {type_name(obj)} value cannot be indexed", span)
        if not isinstance(index, int):
            self.fail(f"a {type_name(obj)} index must be an integer, not {type_name(index)}",
                      span)
        if not -len(obj) <= index < len(obj):
            return self.undefined(f"index {index} out of range (length {len(obj)})", span,
                                  lenient)
        return obj[index]

    def undefined(self, reason: str, span: Span, lenient: bool) -> Undefined:
        """A missing value: an Undefined where one is allowed, else the error."""
        if not lenient:
            self.fail(reason, span)
        return Undefined(reason)

    def method(self, obj: Any, name: str, span: Span) -> Any:
        """A dict's items(), keys() or values() (the compiler refuses any other method)."""
        method = METHODS.get(name)
        if method is None:
            self.fail(f"method calls are not supported: '.{name}()'", span)
        return self.built(method(obj))

    def slice(self, node: ex.Slice) -> Any:
        obj = self.eval(node.obj)
        parts = [None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)]
        if not isinstance(obj, (list, tuple, str, range)):
            self.fail(f"a {type_name(obj)} value cannot be sliced", node.span)
        if any(p is not None and not isinstance(p, int) for p in parts):
            self.fail("slice bounds must be integers", node.span)
        if parts[2] == 0:
            self.fail("slice step cannot be zero", node.span)
        return obj[parts[0]:parts[1]:parts[2]]

    def unary(self, op: str, value: Any) -> Any:
        if op == "not":
            return not value
        if not isinstance(value, (int, float)):
            raise TypeError(f"bad operand for unary {op}: {type_name(value)}")
        return -value if op == "-" else +value

    def binary(self, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            _check_repeat(left, right, self.int_bits)
        elif op == "**":
            _check_power(left, right, self.int_bits)
        elif op == "+" and isinstance(left, (str, list, tuple)):
            if _size(left) + _size(right) > MAX_SIZE:
                raise LimitExceeded(f"result would exceed {MAX_SIZE} items")
        elif op == "~":
            return self.concat(left, right)
        elif op == "%" and not isinstance(left, (int, float)):
            raise TypeError(f"'%' needs numbers, not {type_name(left)} (string formatting is not "
                            "supported)")
        result = _ARITHMETIC[op](left, right)
        if isinstance(result, complex):
            raise ValueError("the result is a complex number")
        if isinstance(result, (str, list)):
            return self.built(result)
        return self.number(result)

    def concat(self, left: Any, right: Any) -> str:
        """`left ~ right`: both as `{{ }}` writes them (lang/builtins.py text_of), joined."""
        for value in (left, right):
            if isinstance(value, list | tuple | Mapping):
                if _size(value) > MAX_SIZE:
                    raise LimitExceeded(f"result would exceed {MAX_SIZE} characters")
                self.read(value)
        text: str = self.built(text_of(left) + text_of(right))
        return text

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

    def arguments(self, func: str, args: tuple[ex.Expr, ...]) -> list[Any]:
        """A call's positional arguments; default's first may be undefined."""
        lenient = func == "default"
        return [self.eval(arg, lenient and index == 0) for index, arg in enumerate(args)]

    def call(self, func: str, args: list[Any], kwargs: tuple[tuple[str, ex.Expr], ...],
             span: Span) -> Any:
        function = FUNCTIONS.get(func)
        if function is None:
            if self.calls is not None and func in self.calls:
                return self.added_call(func, args, kwargs, span)
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
        if func not in CONSTANT_TIME:  # the others' work grows with their arguments
            for value in values:
                self.read(value)
        if func in EXTRA_COSTS:
            self.budget.charge(EXTRA_COSTS[func](args))
        try:
            result = function(*args, **named)
        except LimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a stdlib call is the user's
            self.fail(f"{func}() failed: {_message(exc)}", span)
        if func in PASS_THROUGH:
            return result
        if isinstance(result, (str, list)):
            return self.built(result)
        return self.number(result)

    def added_call(self, func: str, args: list[Any], kwargs: tuple[tuple[str, ex.Expr], ...],
                   span: Span) -> Any:
        """A macro, host function or run_tool (Calls): arguments evaluated here, the call made
        by the runtime; what it returns is charged as a value built."""
        assert self.calls is not None
        named = {name: self.eval(value) for name, value in kwargs}
        if any(callable(value) for value in [*args, *named.values()]):
            self.fail(f"a function cannot be an argument of {func}()", span)
        try:
            result = self.calls.call(func, args, named, span)
        except (QrunError, LimitExceeded):
            raise
        except Exception as exc:
            # The runtime failing inside a macro's or a file's body (a bug, not the template's
            # fault) must not pass for the template's error that eval() makes of a KeyError
            # or a TypeError, which `{% try %}` would then swallow.
            raise CallFailure(exc) from exc
        if isinstance(result, (str, list, Mapping)):
            return self.built(result)
        return self.number(result)


class CallFailure(RuntimeError):
    """An exception that is not a QrunError out of a macro, call() or host function call made
    through Calls: the runtime's own failure, reported as an internal error."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")


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


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {  # `~` is Evaluator.concat
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge, "in": _in, "not in": _not_in,
}
