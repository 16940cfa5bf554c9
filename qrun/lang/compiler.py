"""Stage 3: ast.Template -> ir.Program. Resolves names (inputs, captures, set and loop
variables), lowers holes (their arguments, constraints and the front matter are checked by
lang/args.py), and runs every static check, reporting all errors at once as TemplateErrors.
compile_source/compile_file run the whole front end."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from qrun.errors import TemplateCompileError, TemplateError, TemplateErrors, UsageError
from qrun.lang import ast, ir
from qrun.lang import expr as ex
from qrun.lang.args import ArgChecker, pattern_name, suggest
from qrun.lang.build import MAX_ERRORS, build_ast
from qrun.lang.evaluate import FUNCTIONS, LOOP_FIELDS, keyword_error
from qrun.lang.parser import parse
from qrun.lang.text import check_encodable, decode_template, normalize_text
from qrun.source import Source, Span


def compile_source(text: str, name: str = "<string>") -> ir.Program:
    """Parse, build and compile template `text` (reported under `name`). The text is
    normalized first (lang/text.py: newlines as Jinja writes them, no byte order mark).

    Raises:
        TemplateErrors: every error found, in source order (a syntax error stops the parse, and
            text that cannot be encoded stops it before, so either is reported alone).
    """
    source = Source(name, normalize_text(text))
    try:
        unencodable = check_encodable(source)
        if unencodable is not None:
            raise unencodable
        tree = parse(source)
    except TemplateError as err:
        raise TemplateErrors([err]) from None
    return compile_template(build_ast(tree, source), source)


def compile_file(path: str | os.PathLike[str]) -> ir.Program:
    """Compile the UTF-8 template file at `path`; errors are reported under that path.

    Raises:
        UsageError: the file cannot be read, or is not UTF-8 (a UTF-16 file is named so).
        TemplateErrors: as compile_source.
    """
    name = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise UsageError(f"cannot read template {name}: {err}") from None
    return compile_source(decode_template(data, name), name)


def compile_template(template: ast.Template, source: Source) -> ir.Program:
    """Check `template` and lower it to the IR.

    Raises:
        TemplateErrors: every TemplateCompileError/ConstraintError found, in source order.
    """
    compiler = _Compiler(source, template)
    options, model, declared = compiler.args.front_matter(template.front_matter,
                                                          compiler.check_new_name)
    compiler.declared = declared
    try:
        ops = compiler.body(template.body, _Flow(), _Context())
    except _TooManyErrors:
        ops = ()
    if compiler.errors:
        raise TemplateErrors(compiler.errors[:MAX_ERRORS])
    inputs = declared if declared is not None else tuple(compiler.free)
    spans = {name: compiler.first_use.get(name) or compiler.declared_at[name] for name in inputs}
    return ir.Program(ops, inputs, declared is not None, tuple(compiler.captures), options, model,
                      source, spans)


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
        self.first_use: dict[str, Span] = {}  # where each input is first used
        self.captures: list[str] = []
        self.holes = _first_spans(template.body, ast.Gen, ast.Select)  # for "captured later"
        self.sets = _first_spans(template.body, ast.Set)
        self.args = ArgChecker(source, self.errors)

    @property
    def declared_at(self) -> dict[str, Span]:
        """Where the `inputs:` front matter line declares each input (for unused ones)."""
        return self.args.declared_at

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
        for arg in node.args:
            if pattern_name(arg) is None:
                self.expr(arg.expr, flow, ctx)
        args = self.args.hole_args(node)
        if isinstance(node, ast.Gen):
            return self.gen(node, args, ctx.in_loop)
        return self.select(node, args, ctx.in_loop)

    def gen(self, node: ast.Gen, args: dict[str, ast.HoleArg], in_loop: bool) -> ir.Gen:
        def get(key: str) -> ex.Expr | None:
            return args[key].expr if key in args else None

        params = ir.GenParams(
            max_tokens=get("max_tokens"), stop=get("stop"), constraint=self.args.constraint(args),
            temperature=get("temperature"), top_p=get("top_p"), top_k=get("top_k"),
            seed=get("seed"), heal=get("heal"))
        return ir.Gen(node.name, params, in_loop, node.span)

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
        if name in ctx.locals or name in flow.bound:
            return
        if self.is_input(name):
            self.first_use.setdefault(name, span)
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
            self.fail(f"unknown variable '{name}'", span, *suggest(name, known),
                      "declared inputs: " + (", ".join(self.declared) or "none"))
        else:
            self.free.append(name)
            self.first_use[name] = span

    # ---- expressions -------------------------------------------------------------------------

    def expr(self, node: ex.Expr, flow: _Flow, ctx: _Context) -> None:
        """Check names, attributes and calls in `node` (recursively)."""
        match node:
            case ex.Name(name=name, span=span):
                self.use(name, span, flow, ctx)
            case ex.Attr(obj=obj, attr=attr, span=span):
                self.attr(obj, attr, span, ctx)
            case ex.Call(func=func, kwargs=kwargs, span=span) | ex.Filter(
                    name=func, kwargs=kwargs, span=span):
                self.function(func, kwargs, span)
        for child in ex.children(node):
            self.expr(child, flow, ctx)

    def attr(self, obj: ex.Expr, attr: str, span: Span, ctx: _Context) -> None:
        if attr.startswith("_"):
            self.fail(f"attributes starting with '_' are not allowed: '{attr}'", span)
        elif isinstance(obj, ex.Name) and obj.name == "loop" and "loop" in ctx.locals \
                and attr not in LOOP_FIELDS:
            self.fail(f"'loop' has no attribute '{attr}'", span,
                      *suggest(attr, LOOP_FIELDS), "loop attributes: " + ", ".join(LOOP_FIELDS))

    def function(self, func: str, kwargs: tuple[tuple[str, ex.Expr], ...], span: Span) -> None:
        if func not in FUNCTIONS:
            self.fail(f"unknown function '{func}'", span, *suggest(func, FUNCTIONS),
                      "functions: " + ", ".join(FUNCTIONS))
            return
        for name, _ in kwargs:
            refused = keyword_error(func, name)
            if refused is not None:
                self.fail(refused, span)


def _first_spans(nodes: tuple[ast.Node, ...], *kinds: type[ast.Gen | ast.Select | ast.Set]
                 ) -> dict[str, Span]:
    """Name -> span of its first hole (or `set`) among `kinds`, in source order."""
    found: dict[str, Span] = {}
    for node in ast.walk(nodes):
        if isinstance(node, kinds):
            found.setdefault(node.name, node.name_span)
    return found


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
