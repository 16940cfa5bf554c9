"""Stage 3: ast.Template -> ir.Program. Resolves names (inputs, captures, set and loop
variables), lowers hole arguments and constraints, and runs every static check, reporting all
errors at once as TemplateErrors. compile_source/compile_file run the whole front end."""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import regex

from qrun.errors import (
    ConstraintError,
    TemplateCompileError,
    TemplateError,
    TemplateErrors,
    UsageError,
)
from qrun.lang import ast, ir
from qrun.lang import expr as ex
from qrun.lang.build import MAX_ERRORS, build_ast
from qrun.lang.evaluate import FUNCTIONS, LOOP_FIELDS
from qrun.lang.parser import parse
from qrun.source import Source, Span
from qrun.stdlib.patterns import PATTERNS

if sys.version_info >= (3, 11):
    from re import _parser as sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_parse

GEN_ARGS = ("max_tokens", "stop", "regex", "json", "temperature", "top_p", "top_k", "seed",
            "heal")
SELECT_ARGS = ("options", "temperature", "normalize")
FRONT_MATTER_KEYS = ("model", "temperature", "top_p", "seed", "max_tokens", "device", "dtype",
                     "inputs")


def compile_source(text: str, name: str = "<string>") -> ir.Program:
    """Parse, build and compile template `text` (reported under `name`).

    Raises:
        TemplateErrors: every error found, in source order (a syntax error stops the parse, so
            it is reported alone).
    """
    source = Source(name, text)
    try:
        tree = parse(source)
    except TemplateError as err:
        raise TemplateErrors([err]) from None
    return compile_template(build_ast(tree, source), source)


def compile_file(path: str | os.PathLike[str]) -> ir.Program:
    """Compile the UTF-8 template file at `path`; errors are reported under that path.

    Raises:
        UsageError: the file cannot be read or is not UTF-8.
        TemplateErrors: as compile_source.
    """
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read template {os.fspath(path)!s}: {err}") from None
    return compile_source(text, os.fspath(path))


def compile_template(template: ast.Template, source: Source) -> ir.Program:
    """Check `template` and lower it to the IR.

    Raises:
        TemplateErrors: every TemplateCompileError/ConstraintError found, in source order.
    """
    compiler = _Compiler(source, template)
    defaults, declared = compiler.front_matter(template.front_matter)
    compiler.declared = declared
    try:
        ops = compiler.body(template.body, _Flow(), _Context())
    except _TooManyErrors:
        ops = ()
    if compiler.errors:
        raise TemplateErrors(compiler.errors[:MAX_ERRORS])
    inputs = declared if declared is not None else tuple(compiler.free)
    return ir.Program(ops, inputs, declared is not None, tuple(compiler.captures), defaults,
                      source)


class _TooManyErrors(Exception):
    """Stops the walk once MAX_ERRORS errors are collected."""


@dataclass
class _Flow:
    """What is known at one point of the template, along every path that reaches it."""

    bound: set[str] = field(default_factory=set)  # captured or set on every path
    captured: dict[str, Span] = field(default_factory=dict)  # captured on some path
    sets: dict[str, Span] = field(default_factory=dict)  # set on some path

    def copy(self) -> _Flow:
        return _Flow(set(self.bound), dict(self.captured), dict(self.sets))

    def merge(self, branches: list[_Flow]) -> None:
        """Join point after if/elif/else: bound on every branch, captured/set on any."""
        self.bound = set.intersection(*(b.bound for b in branches))
        for branch in branches:
            self.captured.update(branch.captured)
            self.sets.update(branch.sets)


@dataclass(frozen=True)
class _Context:
    """The lexical context: loop variables, whether inside a loop, the enclosing role."""

    locals: frozenset[str] = frozenset()
    in_loop: bool = False
    role: ast.Role | None = None


class _Compiler:
    def __init__(self, source: Source, template: ast.Template) -> None:
        self.source = source
        self.errors: list[TemplateError] = []
        self.declared: tuple[str, ...] | None = None
        self.free: list[str] = []  # inputs discovered as free variables, in first-use order
        self.captures: list[str] = []
        self.holes = dict(_holes(template.body))  # first hole per name, for "captured later"
        self.sets = dict(_sets(template.body))

    def fail(self, message: str, span: Span, *notes: str) -> None:
        self.errors.append(TemplateCompileError(message, span, self.source, notes))

    # ---- statements --------------------------------------------------------------------------

    def body(self, nodes: tuple[ast.Node, ...], flow: _Flow, ctx: _Context
             ) -> tuple[ir.Op, ...]:
        ops: list[ir.Op] = []
        for node in nodes:
            if len(self.errors) >= MAX_ERRORS:
                raise _TooManyErrors
            op = self.node(node, flow, ctx)
            if op is not None:
                ops.append(op)
        return _merge_text(ops)

    def node(self, node: ast.Node, flow: _Flow, ctx: _Context) -> ir.Op | None:
        match node:
            case ast.Text(text=text, span=span):
                return ir.EmitText(text, span)
            case ast.Interp(expr=value, span=span):
                self.expr(value, flow, ctx)
                return ir.EmitValue(value, span)
            case ast.Gen() | ast.Select():
                hole = self.hole(node, flow, ctx)
                self.capture(node.name, node.name_span, flow, ctx)
                return hole
            case ast.If():
                return self.if_(node, flow, ctx)
            case ast.For():
                return self.for_(node, flow, ctx)
            case ast.Set(name=name, expr=value, span=span):
                self.expr(value, flow, ctx)
                self.assign(name, node.name_span, flow, ctx)
                return ir.Set(name, value, span)
            case ast.Role():
                return self.role(node, flow, ctx)
        return None

    def if_(self, node: ast.If, flow: _Flow, ctx: _Context) -> ir.If:
        branches: list[ir.Branch] = []
        flows: list[_Flow] = []
        for arm in node.arms:
            self.expr(arm.test, flow, ctx)
            arm_flow = flow.copy()
            branches.append(ir.Branch(arm.test, self.body(arm.body, arm_flow, ctx), arm.span))
            flows.append(arm_flow)
        else_flow = flow.copy()
        orelse = self.body(node.orelse or (), else_flow, ctx)
        flow.merge([*flows, else_flow])
        return ir.If(tuple(branches), orelse, node.span)

    def for_(self, node: ast.For, flow: _Flow, ctx: _Context) -> ir.For:
        self.expr(node.iterable, flow, ctx)
        self.check_new_name(node.target, node.target_span, "loop variable")
        inner = replace(ctx, locals=ctx.locals | {node.target, "loop"}, in_loop=True)
        body_flow = flow.copy()
        body = self.body(node.body, body_flow, inner)
        # Captures in the body are lists after the loop; `set`s stay local to the body.
        new_captures = {n for n in body_flow.captured if n not in flow.captured}
        flow.bound |= body_flow.bound & new_captures
        flow.captured.update(body_flow.captured)
        flow.sets.update(body_flow.sets)
        return ir.For(node.target, node.iterable, body, node.span)

    def role(self, node: ast.Role, flow: _Flow, ctx: _Context) -> ir.Role:
        if ctx.role is not None:
            outer = ctx.role
            self.fail(f"'{{% {node.role} %}}' inside '{{% {outer.role} %}}': roles cannot nest",
                      node.span, f"the '{{% {outer.role} %}}' block starts at {outer.span}")
        body = self.body(node.body, flow, replace(ctx, role=node))
        return ir.Role(node.role, body, node.span)

    # ---- holes -------------------------------------------------------------------------------

    def hole(self, node: ast.Gen | ast.Select, flow: _Flow, ctx: _Context
             ) -> ir.Gen | ir.Select:
        kind, allowed = ("gen", GEN_ARGS) if isinstance(node, ast.Gen) else ("select",
                                                                              SELECT_ARGS)
        args: dict[str, ast.HoleArg] = {}
        for arg in node.args:
            if _pattern_name(arg) is None:
                self.expr(arg.expr, flow, ctx)
            if arg.name not in allowed:
                self.fail(f"unknown argument '{arg.name}' for {kind}",
                          _prefix(arg.span, len(arg.name)), *_suggest(arg.name, allowed),
                          f"{kind} accepts: " + ", ".join(allowed))
            elif arg.name in args:
                self.fail(f"argument '{arg.name}' given twice", _prefix(arg.span, len(arg.name)),
                          f"first given at {args[arg.name].span}")
            else:
                args[arg.name] = arg
                self.check_literal(arg)
        if isinstance(node, ast.Gen):
            return self.gen(node, args, ctx.in_loop)
        return self.select(node, args, ctx.in_loop)

    def check_literal(self, arg: ast.HoleArg) -> None:
        """Literal arguments are type-checked now; others when the runtime evaluates them."""
        value = _literal(arg.expr)
        check = _CHECKS.get(arg.name)
        wanted = None if value is _MISSING or check is None else check(value)
        if wanted is not None:
            error = ConstraintError if arg.name in ("regex", "json") else TemplateCompileError
            self.errors.append(error(f"{arg.name} must be {wanted}, got {_show(value)}",
                                     arg.expr.span, self.source))

    def gen(self, node: ast.Gen, args: dict[str, ast.HoleArg], in_loop: bool) -> ir.Gen:
        def get(key: str) -> ex.Expr | None:
            return args[key].expr if key in args else None

        params = ir.GenParams(
            max_tokens=get("max_tokens"), stop=get("stop"), constraint=self.constraint(args),
            temperature=get("temperature"), top_p=get("top_p"), top_k=get("top_k"),
            seed=get("seed"), heal=get("heal"))
        return ir.Gen(node.name, params, in_loop, node.span)

    def constraint(self, args: dict[str, ast.HoleArg]) -> ir.Constraint | None:
        if "regex" in args and "json" in args:
            later = max(args["regex"], args["json"], key=lambda a: a.span.start)
            self.errors.append(ConstraintError(
                "regex= and json= cannot both constrain one hole", later.span, self.source))
            return None
        if "json" in args:
            return ir.JsonSchema(args["json"].expr)
        arg = args.get("regex")
        if arg is None:
            return None
        name = _pattern_name(arg)
        if name is not None:
            if name in PATTERNS:
                return ir.Regex(ex.Const(PATTERNS[name], arg.expr.span), name)
            self.errors.append(ConstraintError(
                f"unknown pattern '{name}'", arg.expr.span, self.source,
                [*_suggest(name, PATTERNS), "patterns: " + ", ".join(sorted(PATTERNS))]))
        elif isinstance(arg.expr, ex.Const) and isinstance(arg.expr.value, str):
            self.check_regex(arg.expr)
        return ir.Regex(arg.expr)

    def check_regex(self, pattern: ex.Const) -> None:
        """Syntax first with Python's own regex parser (what runtime/dfa.py builds its automaton
        from; it does not expand repeats), then a size bound, and only then `regex.compile`,
        which expands `(?:x{65535}){65535}` until memory runs out."""
        try:
            size = _regex_size(sre_parse.parse(pattern.value), 0)
            if size > REGEX_MAX_SIZE:
                raise ValueError(f"pattern too large once repeats are expanded (~{size} "
                                 f"items, at most {REGEX_MAX_SIZE})")
            regex.compile(pattern.value)
        except Exception as err:  # noqa: BLE001 - re.error, regex.error, RecursionError...
            span = pattern.span
            pos = getattr(err, "pos", None)
            if isinstance(pos, int) and self.source.text[span.start + 1:span.end - 1] == \
                    pattern.value:  # no escapes: point at the offending character
                span = _shift(span, 1 + pos)
            message = getattr(err, "msg", None) or str(err) or type(err).__name__
            if isinstance(err, RecursionError):
                message = "pattern nested too deeply"
            self.errors.append(ConstraintError(f"invalid regex: {message}", span, self.source))

    def select(self, node: ast.Select, args: dict[str, ast.HoleArg], in_loop: bool
               ) -> ir.Select:
        options = args.get("options")
        if options is None:
            self.fail(f"select '{node.name}' needs options=[...]", node.span,
                      'e.g. {{ select color options=["red", "green"] }}')
        temperature, normalize = args.get("temperature"), args.get("normalize")
        return ir.Select(
            node.name, options.expr if options else ex.ListExpr((), node.span),
            temperature.expr if temperature else None, normalize.expr if normalize else None,
            in_loop, node.span)

    # ---- front matter ------------------------------------------------------------------------

    def front_matter(self, front: ast.FrontMatter | None
                     ) -> tuple[ir.RunDefaults, tuple[str, ...] | None]:
        if front is None:
            return ir.RunDefaults(), None
        values: dict[str, Any] = {}
        declared: tuple[str, ...] | None = None
        seen: dict[str, Span] = {}
        for entry in front.entries:
            key_span = _prefix(entry.span, len(entry.key))
            if entry.key not in FRONT_MATTER_KEYS:
                self.fail(f"unknown front matter key '{entry.key}'", key_span,
                          *_suggest(entry.key, FRONT_MATTER_KEYS),
                          "keys: " + ", ".join(FRONT_MATTER_KEYS))
            elif entry.key in seen:
                self.fail(f"front matter key '{entry.key}' given twice", key_span,
                          f"first given at {seen[entry.key]}")
            elif entry.key == "inputs":
                seen[entry.key] = key_span
                declared = self.inputs(entry)
            else:
                seen[entry.key] = key_span
                value = self.front_value(entry)
                if value is not _MISSING:
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
            return _MISSING
        return value

    def inputs(self, entry: ast.FrontMatterEntry) -> tuple[str, ...]:
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
            elif self.check_new_name(name, entry.value_span, "input"):
                names.append(name)
        return tuple(names)

    # ---- names -------------------------------------------------------------------------------

    def check_new_name(self, name: str, span: Span, what: str) -> bool:
        if name.startswith("_") or "__" in name:
            self.fail(f"{what} '{name}': names may not start with '_' or contain '__'", span)
            return False
        if name == "loop":
            self.fail(f"'loop' is reserved for the loop variable and cannot be a {what}",
                      span)
            return False
        return True

    def capture(self, name: str, span: Span, flow: _Flow, ctx: _Context) -> None:
        if not self.check_new_name(name, span, "capture"):
            return
        if name in flow.captured:
            first = flow.captured[name]
            self.fail(f"'{name}' is captured twice", span, f"first captured at {first}",
                      "use a different name, or a loop to capture a list")
        elif self.is_input(name):
            self.fail(f"capture '{name}' has the same name as an input", span)
        elif name in self.sets:
            self.fail(f"capture '{name}' has the same name as a 'set' variable", span,
                      f"set at {self.sets[name]}")
        elif name in ctx.locals:
            self.fail(f"capture '{name}' has the same name as a loop variable", span)
        flow.bound.add(name)
        flow.captured.setdefault(name, span)
        if name not in self.captures:
            self.captures.append(name)

    def assign(self, name: str, span: Span, flow: _Flow, ctx: _Context) -> None:
        if not self.check_new_name(name, span, "set variable"):
            return
        if self.is_input(name):  # a capture of the same name is reported at the capture
            self.fail(f"'set {name}' uses the name of an input", span)
        flow.bound.add(name)
        flow.sets.setdefault(name, span)

    def is_input(self, name: str) -> bool:
        if self.declared is not None:
            return name in self.declared
        return name in self.free

    def use(self, name: str, span: Span, flow: _Flow, ctx: _Context) -> None:
        if name.startswith("_"):
            self.fail(f"names starting with '_' are not allowed: '{name}'", span)
            return
        if name in ctx.locals or name in flow.bound or self.is_input(name):
            return
        if name in flow.captured:
            self.fail(f"'{name}' is not captured on every path that reaches here", span,
                      f"it is captured at {flow.captured[name]}")
        elif name in flow.sets:
            self.fail(f"'{name}' is not set on every path that reaches here", span,
                      f"it is set at {flow.sets[name]}")
        elif name in self.holes:
            self.fail(f"'{name}' is used before it is captured", span,
                      f"it is captured at {self.holes[name]}")
        elif name in self.sets:
            self.fail(f"'{name}' is used before it is set", span,
                      f"it is set at {self.sets[name]}")
        elif self.declared is not None:
            known = [*self.declared, *flow.bound, *ctx.locals]
            self.fail(f"unknown variable '{name}'", span, *_suggest(name, known),
                      "declared inputs: " + (", ".join(self.declared) or "none"))
        else:
            self.free.append(name)

    # ---- expressions -------------------------------------------------------------------------

    def expr(self, node: ex.Expr, flow: _Flow, ctx: _Context) -> None:
        """Check names, attributes and calls in `node` (recursively)."""
        match node:
            case ex.Name(name=name, span=span):
                self.use(name, span, flow, ctx)
            case ex.Attr(obj=obj, attr=attr, span=span):
                self.attr(obj, attr, span, ctx)
            case ex.Call(func=func, span=span) | ex.Filter(name=func, span=span):
                self.function(func, span)
        for child in _children(node):
            self.expr(child, flow, ctx)

    def attr(self, obj: ex.Expr, attr: str, span: Span, ctx: _Context) -> None:
        if attr.startswith("_"):
            self.fail(f"attributes starting with '_' are not allowed: '{attr}'", span)
        elif isinstance(obj, ex.Name) and obj.name == "loop" and "loop" in ctx.locals \
                and attr not in LOOP_FIELDS:
            self.fail(f"'loop' has no attribute '{attr}'", span,
                      *_suggest(attr, LOOP_FIELDS), "loop attributes: " + ", ".join(LOOP_FIELDS))

    def function(self, func: str, span: Span) -> None:
        if func not in FUNCTIONS:
            self.fail(f"unknown function '{func}'", span, *_suggest(func, FUNCTIONS),
                      "functions: " + ", ".join(FUNCTIONS))


def _children(node: ex.Expr) -> Iterator[ex.Expr]:
    """The sub-expressions of `node`, in source order."""
    match node:
        case ex.Attr(obj=obj):
            yield obj
        case ex.Index(obj=obj, index=index):
            yield from (obj, index)
        case ex.Slice(obj=obj, lower=lower, upper=upper, step=step):
            yield obj
            yield from (p for p in (lower, upper, step) if p is not None)
        case ex.ListExpr(items=items):
            yield from items
        case ex.DictExpr(items=pairs):
            for key, value in pairs:
                yield from (key, value)
        case ex.Unary(operand=operand):
            yield operand
        case ex.Binary(left=left, right=right):
            yield from (left, right)
        case ex.Compare(left=left, rights=rights):
            yield left
            yield from rights
        case ex.BoolOp(values=values):
            yield from values
        case ex.Cond(body=body, test=test, orelse=orelse):
            yield from (body, test, orelse)
        case ex.Call(args=args, kwargs=kwargs):
            yield from args
            yield from (v for _, v in kwargs)
        case ex.Filter(value=value, args=args, kwargs=kwargs):
            yield value
            yield from args
            yield from (v for _, v in kwargs)


def _holes(nodes: tuple[ast.Node, ...]) -> Iterator[tuple[str, Span]]:
    for node in reversed(list(_walk(nodes))):  # reversed: dict() keeps the first hole
        if isinstance(node, (ast.Gen, ast.Select)):
            yield node.name, node.name_span


def _sets(nodes: tuple[ast.Node, ...]) -> Iterator[tuple[str, Span]]:
    for node in reversed(list(_walk(nodes))):
        if isinstance(node, ast.Set):
            yield node.name, node.name_span


def _walk(nodes: tuple[ast.Node, ...]) -> Iterator[ast.Node]:
    for node in nodes:
        yield node
        if isinstance(node, ast.If):
            for arm in node.arms:
                yield from _walk(arm.body)
            yield from _walk(node.orelse or ())
        elif isinstance(node, (ast.For, ast.Role)):
            yield from _walk(node.body)


def _merge_text(ops: list[ir.Op]) -> tuple[ir.Op, ...]:
    """Adjacent EmitText ops (split by a comment or a raw block) become one."""
    merged: list[ir.Op] = []
    for op in ops:
        last = merged[-1] if merged else None
        if isinstance(op, ir.EmitText) and isinstance(last, ir.EmitText):
            a, b = last.span, op.span
            span = Span(a.start, b.end, a.line, a.column, b.end_line, b.end_column)
            merged[-1] = ir.EmitText(last.text + op.text, span)
        else:
            merged.append(op)
    return tuple(merged)


def _suggest(name: str, known: Iterable[str]) -> list[str]:
    close = difflib.get_close_matches(name, list(known), n=1)
    return [f"did you mean '{close[0]}'?"] if close else []


# ---- literal argument checks: each returns what the value must be, or None when it is fine ----

_MISSING: Any = object()


def _literal(node: ex.Expr) -> Any:
    """The value of a literal expression (constants, signed numbers, lists and dicts of them),
    or _MISSING when `node` needs the runtime."""
    match node:
        case ex.Const(value=value):
            return value
        case ex.Unary(op="-" | "+", operand=ex.Const(value=value)) if _is_number(value):
            return -value if node.op == "-" else value
        case ex.ListExpr(items=items):
            values = [_literal(item) for item in items]
            return _MISSING if any(v is _MISSING for v in values) else values
        case ex.DictExpr(items=pairs):
            keys = [_literal(k) for k, _ in pairs]
            if not all(isinstance(k, (str, int, float, bool)) for k in keys):
                return _MISSING
            values = [_literal(v) for _, v in pairs]
            if any(v is _MISSING for v in values):
                return _MISSING
            return dict(zip(keys, values, strict=True))
    return _MISSING


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


def _pattern_name(arg: ast.HoleArg) -> str | None:
    """`regex=INT`: an UPPERCASE name is a stdlib pattern, never a variable."""
    if arg.name == "regex" and isinstance(arg.expr, ex.Name) and re.fullmatch(
            r"[A-Z][A-Z0-9_]*", arg.expr.name):
        return arg.expr.name
    return None


def _show(value: Any) -> str:
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


REGEX_MAX_SIZE = 100_000
"""A literal regex may expand (repeats unrolled) to at most this many items."""


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


def _prefix(span: Span, length: int) -> Span:
    """The first `length` characters of a one-line span."""
    end = min(span.end, span.start + length)
    return Span(span.start, end, span.line, span.column, span.line,
                span.column + end - span.start)


def _shift(span: Span, offset: int) -> Span:
    """One character `offset` characters into a one-line span."""
    offset = min(offset, max(0, span.end - span.start - 1))
    return Span(span.start + offset, span.start + offset + 1, span.line, span.column + offset,
                span.line, span.column + offset + 1)
