"""Part of stage 3 (compile_template): hole arguments and front matter. Which keys exist, the type
checks of literal values, constraint lowering with the compile-time regex and JSON Schema checks
(through the runtime's own DFA compiler), and typed front-matter defaults."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from re import _parser as sre_parse  # Python's regex parser, which runtime/dfa.py reads with
from typing import Any

import regex

from qrun.errors import ConstraintError, TemplateCompileError, TemplateError
from qrun.lang import ast, ir
from qrun.lang import expr as ex
from qrun.runtime.dfa import PatternError, compile_dfa
from qrun.source import Source, Span
from qrun.stdlib.json_schema import SchemaError, schema_to_regex
from qrun.stdlib.patterns import PATTERNS

GEN_ARGS = ("max_tokens", "stop", "regex", "json", "temperature", "top_p", "top_k", "seed",
            "heal")
SELECT_ARGS = ("options", "temperature", "normalize")
FRONT_MATTER_KEYS = ("model", "temperature", "top_p", "seed", "max_tokens", "device", "dtype",
                     "inputs")
REGEX_MAX_SIZE = 100_000
"""A literal regex may expand (repeats unrolled) to at most this many items. Checked before
anything calls `regex.compile` (runtime/dfa.py does too), which expands `(?:x{65535}){65535}`
until memory runs out; compile_dfa's own NFA/DFA state caps only apply after that."""

NameCheck = Callable[[str, Span, str], bool]
"""The compiler's check of a new name (`name`, `span`, what it is): False when it reported one."""


class ArgChecker:
    """Checks the arguments of every hole and the front matter of one compile. Errors go to the
    shared `errors` list; compiled patterns are cached for the duration of the compile."""

    def __init__(self, source: Source, errors: list[TemplateError]) -> None:
        self.source = source
        self.errors = errors
        self.dfa_errors: dict[str, str | None] = {}  # pattern -> PatternError message or None

    def fail(self, message: str, span: Span, *notes: str) -> None:
        self.errors.append(TemplateCompileError(message, span, self.source, notes))

    def constraint_error(self, message: str, span: Span, *notes: str) -> None:
        self.errors.append(ConstraintError(message, span, self.source, notes))

    # ---- hole arguments ----------------------------------------------------------------------

    def hole_args(self, node: ast.Gen | ast.Select) -> dict[str, ast.HoleArg]:
        """The hole's arguments by name, after reporting unknown, repeated and ill-typed ones
        (only the first of a repeated argument is kept)."""
        kind, allowed = ("gen", GEN_ARGS) if isinstance(node, ast.Gen) else ("select",
                                                                              SELECT_ARGS)
        args: dict[str, ast.HoleArg] = {}
        for arg in node.args:
            if arg.name not in allowed:
                self.fail(f"unknown argument '{arg.name}' for {kind}",
                          prefix(arg.span, len(arg.name)), *suggest(arg.name, allowed),
                          f"{kind} accepts: " + ", ".join(allowed))
            elif arg.name in args:
                self.fail(f"argument '{arg.name}' given twice", prefix(arg.span, len(arg.name)),
                          f"first given at {args[arg.name].span}")
            else:
                args[arg.name] = arg
                self.check_literal(arg)
        return args

    def check_literal(self, arg: ast.HoleArg) -> None:
        """Literal arguments are type-checked now; others when the runtime evaluates them."""
        value = literal(arg.expr)
        check = _CHECKS.get(arg.name)
        wanted = None if value is MISSING or check is None else check(value)
        if wanted is not None:
            error = ConstraintError if arg.name in ("regex", "json") else TemplateCompileError
            self.errors.append(error(f"{arg.name} must be {wanted}, got {_show(value)}",
                                     arg.expr.span, self.source))

    def constraint(self, args: dict[str, ast.HoleArg]) -> ir.Constraint | None:
        """The constraint of a gen hole; literal patterns and schemas are checked now."""
        if "regex" in args and "json" in args:
            later = max(args["regex"], args["json"], key=lambda a: a.span.start)
            self.constraint_error("regex= and json= cannot both constrain one hole", later.span)
            return None
        if "json" in args:
            self.check_schema(args["json"].expr)
            return ir.JsonSchema(args["json"].expr)
        arg = args.get("regex")
        if arg is None:
            return None
        name = pattern_name(arg)
        if name is not None:
            if name in PATTERNS:
                self.check_dfa(PATTERNS[name], arg.expr.span)
                return ir.Regex(ex.Const(PATTERNS[name], arg.expr.span), name)
            self.constraint_error(
                f"unknown pattern '{name}'", arg.expr.span,
                *suggest(name, PATTERNS), "patterns: " + ", ".join(sorted(PATTERNS)))
        elif isinstance(arg.expr, ex.Const) and isinstance(arg.expr.value, str):
            self.check_regex(arg.expr)
        return ir.Regex(arg.expr)

    def check_regex(self, pattern: ex.Const) -> None:
        """Syntax first with Python's own regex parser (what runtime/dfa.py builds its automaton
        from; it does not expand repeats), then a size bound, then `regex.compile` (the reference
        syntax) and finally the DFA compiler the runtime uses, which names constructs a token
        mask cannot express (backreferences, lookarounds, \\b...) and empty languages."""
        try:
            parsed = sre_parse.parse(pattern.value)
        except Exception as err:  # noqa: BLE001 - re.error, RecursionError, OverflowError...
            if _rough_size(pattern.value) <= REGEX_MAX_SIZE:
                # `regex`-only syntax (\p{L}, \X...): compile_dfa explains it better.
                if self.check_dfa(pattern.value, pattern.span, syntax_only=True):
                    return
            self.invalid_regex(err, pattern)
            return
        try:
            size = _regex_size(parsed, 0)
            if size > REGEX_MAX_SIZE:
                raise ValueError(f"pattern too large once repeats are expanded (~{size} "
                                 f"items, at most {REGEX_MAX_SIZE})")
            regex.compile(pattern.value)
        except Exception as err:  # noqa: BLE001 - regex.error, RecursionError, ValueError...
            self.invalid_regex(err, pattern)
            return
        self.check_dfa(pattern.value, pattern.span)

    def invalid_regex(self, err: Exception, pattern: ex.Const) -> None:
        span = pattern.span
        pos = getattr(err, "pos", None)
        if isinstance(pos, int) and self.source.text[span.start + 1:span.end - 1] == \
                pattern.value:  # no escapes: point at the offending character
            span = _shift(span, 1 + pos)
        message = getattr(err, "msg", None) or str(err) or type(err).__name__
        if isinstance(err, RecursionError):
            message = "pattern nested too deeply"
        self.constraint_error(f"invalid regex: {message}", span)

    def check_dfa(self, pattern: str, span: Span, syntax_only: bool = False) -> bool:
        """Compile `pattern` as the runtime will; report its PatternError at `span`. Returns
        whether an error was reported. With `syntax_only`, only errors that are not plain
        syntax errors are reported (the caller reports those with a position)."""
        if pattern not in self.dfa_errors:
            try:
                compile_dfa(pattern)
                self.dfa_errors[pattern] = None
            except PatternError as err:
                self.dfa_errors[pattern] = str(err)
            except RecursionError:
                self.dfa_errors[pattern] = "pattern nested too deeply"
        message = self.dfa_errors[pattern]
        if message is None or (syntax_only and message.startswith("invalid regex")):
            return False
        self.constraint_error(message, span)
        return True

    def check_schema(self, schema: ex.Expr) -> None:
        """A literal JSON Schema is lowered now (schemas with non-literal parts at run time)."""
        value = literal(schema)
        if not isinstance(value, dict):
            return
        try:
            schema_to_regex(value)
        except SchemaError as err:
            self.constraint_error(str(err), schema.span)
        except RecursionError:
            self.constraint_error("JSON Schema nested too deeply", schema.span)

    # ---- front matter ------------------------------------------------------------------------

    def front_matter(self, front: ast.FrontMatter | None, check_name: NameCheck
                     ) -> tuple[ir.RunDefaults, tuple[str, ...] | None]:
        """The run defaults and the declared inputs (None without an `inputs:` line)."""
        if front is None:
            return ir.RunDefaults(), None
        values: dict[str, Any] = {}
        declared: tuple[str, ...] | None = None
        seen: dict[str, Span] = {}
        for entry in front.entries:
            key_span = prefix(entry.span, len(entry.key))
            if entry.key not in FRONT_MATTER_KEYS:
                self.fail(f"unknown front matter key '{entry.key}'", key_span,
                          *suggest(entry.key, FRONT_MATTER_KEYS),
                          "keys: " + ", ".join(FRONT_MATTER_KEYS))
            elif entry.key in seen:
                self.fail(f"front matter key '{entry.key}' given twice", key_span,
                          f"first given at {seen[entry.key]}")
            elif entry.key == "inputs":
                seen[entry.key] = key_span
                declared = self.inputs(entry, check_name)
            else:
                seen[entry.key] = key_span
                value = self.front_value(entry)
                if value is not MISSING:
                    values[entry.key] = value
        return ir.RunDefaults(**values), declared

    def front_value(self, entry: ast.FrontMatterEntry) -> Any:
        raw = _unquote(entry.value)
        value: Any = raw
        wanted = _FRONT_CHECKS[entry.key](raw)
        if entry.key in _CHECKS:
            value = _scalar(raw)
            wanted = _CHECKS[entry.key](value)
            if wanted is None and entry.key in ("temperature", "top_p"):
                value = float(value)
        if wanted is not None:
            self.fail(f"front matter '{entry.key}' must be {wanted}, got {_show(value)}",
                      entry.value_span)
            return MISSING
        return value

    def inputs(self, entry: ast.FrontMatterEntry, check_name: NameCheck) -> tuple[str, ...]:
        text = entry.value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            self.fail("front matter 'inputs' must be a list such as [question, context]",
                      entry.value_span)
            return ()
        names: list[str] = []
        for item in (p.strip() for p in text[1:-1].split(",")):
            name = _unquote(item)
            if not item:
                continue
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                self.fail(f"input '{name}' is not a valid name", entry.value_span)
            elif name in names:
                self.fail(f"input '{name}' is declared twice", entry.value_span)
            elif check_name(name, entry.value_span, "input"):
                names.append(name)
        return tuple(names)


def pattern_name(arg: ast.HoleArg) -> str | None:
    """`regex=INT`: an UPPERCASE name is a stdlib pattern, never a variable."""
    if arg.name == "regex" and isinstance(arg.expr, ex.Name) and re.fullmatch(
            r"[A-Z][A-Z0-9_]*", arg.expr.name):
        return arg.expr.name
    return None


def suggest(name: str, known: Iterable[str]) -> list[str]:
    """A "did you mean ...?" note for the closest known name, if any is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return [f"did you mean '{close[0]}'?"] if close else []


def prefix(span: Span, length: int) -> Span:
    """The first `length` characters of a one-line span."""
    end = min(span.end, span.start + length)
    return Span(span.start, end, span.line, span.column, span.line,
                span.column + end - span.start)


def _shift(span: Span, offset: int) -> Span:
    """One character `offset` characters into a one-line span."""
    offset = min(offset, max(0, span.end - span.start - 1))
    return Span(span.start + offset, span.start + offset + 1, span.line, span.column + offset,
                span.line, span.column + offset + 1)


# ---- literal argument checks: each returns what the value must be, or None when it is fine ----

MISSING: Any = object()
"""What `literal` returns for an expression that needs the runtime."""


def literal(node: ex.Expr) -> Any:
    """The value of a literal expression (constants, signed numbers, lists and dicts of them),
    or MISSING when `node` needs the runtime."""
    match node:
        case ex.Const(value=value):
            return value
        case ex.Unary(op="-" | "+", operand=ex.Const(value=value)) if _is_number(value):
            return -value if node.op == "-" else value
        case ex.ListExpr(items=items):
            values = [literal(item) for item in items]
            return MISSING if any(v is MISSING for v in values) else values
        case ex.DictExpr(items=pairs):
            keys = [literal(k) for k, _ in pairs]
            if not all(isinstance(k, (str, int, float, bool)) for k in keys):
                return MISSING
            values = [literal(v) for _, v in pairs]
            if any(v is MISSING for v in values):
                return MISSING
            return dict(zip(keys, values, strict=True))
    return MISSING


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
        value)


def _want_positive(value: Any) -> str | None:
    return None if _is_int(value) and value >= 1 else "a positive integer"


def _want_count(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else "an integer >= 0"


def _want_temperature(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else "a number >= 0"


def _want_top_p(value: Any) -> str | None:
    return None if _is_number(value) and 0 < value <= 1 else "a number in (0, 1]"


def _want_stop(value: Any) -> str | None:
    items = value if isinstance(value, list) else [value]
    if items and all(isinstance(s, str) and s for s in items):
        return None
    return "a non-empty string or a non-empty list of them"


def _want_options(value: Any) -> str | None:
    if not (isinstance(value, list) and value and all(isinstance(s, str) and s for s in value)):
        return "a non-empty list of non-empty strings"
    duplicates = sorted({s for s in value if value.count(s) > 1})
    return None if not duplicates else f"distinct strings ({_show(duplicates[0])} repeats)"


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "max_tokens": _want_positive,
    "stop": _want_stop,
    "temperature": _want_temperature,
    "top_p": _want_top_p,
    "top_k": _want_count,
    "seed": _want_count,
    "heal": lambda v: None if isinstance(v, bool) else "true or false",
    "normalize": lambda v: None if v in ("sum", "mean") else '"sum" or "mean"',
    "options": _want_options,
    "json": lambda v: None if isinstance(v, dict) else "a JSON Schema (a dict or a variable)",
    "regex": lambda v: None if isinstance(v, str) else "a string or a pattern name such as INT",
}
_FRONT_CHECKS: dict[str, Callable[[str], str | None]] = {
    "model": lambda v: None if v else "a model name or path",
    "device": lambda v: None if re.fullmatch(r"cpu|cuda(:[0-9]+)?|mps|auto", v) else
    "cpu, cuda, cuda:N, mps or auto",
    "dtype": lambda v: None if v in ("float32", "float16", "bfloat16", "auto") else
    "float32, float16, bfloat16 or auto",
    "temperature": lambda v: None, "top_p": lambda v: None, "seed": lambda v: None,
    "max_tokens": lambda v: None,
}


def _scalar(text: str) -> Any:
    """A front matter number (or the text itself when it is not one)."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _show(value: Any) -> str:
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- regex size ---------------------------------------------------------------------------------


def _regex_size(items: Any, depth: int) -> int:
    """Items in a parsed pattern with bounded repeats unrolled; stops early past the limit."""
    if depth > 100:
        raise ValueError("pattern nested too deeply")
    total = 0
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            count = max(low, 1) if high == sre_parse.MAXREPEAT else max(high, 1)
            total += count * _regex_size(sub, depth + 1)
        else:
            total += 1 + sum(_regex_size(s, depth + 1) for s in _subpatterns(av))
        if total > REGEX_MAX_SIZE:
            return total
    return total


def _subpatterns(value: Any) -> Iterator[Any]:
    if isinstance(value, sre_parse.SubPattern):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _subpatterns(item)


_REPEATS = {getattr(sre_parse, name) for name in ("MAX_REPEAT", "MIN_REPEAT",
                                                  "POSSESSIVE_REPEAT") if hasattr(sre_parse, name)}
_QUANTIFIER = re.compile(r"\{([0-9]*)(?:,([0-9]*))?\}")


def _rough_size(pattern: str) -> int:
    """An upper bound on the expanded size of a pattern Python's parser rejects (`regex`-only
    syntax): its length times every `{m,n}` count, so nesting is always covered."""
    size = max(len(pattern), 1)
    for match in _QUANTIFIER.finditer(pattern):
        count = match.group(2) or match.group(1) or "0"
        if len(count) > 9:
            return REGEX_MAX_SIZE + 1
        size *= max(int(count), 1)
        if size > REGEX_MAX_SIZE:
            break
    return size
