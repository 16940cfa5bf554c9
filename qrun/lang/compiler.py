"""Stage 3: ast.Template -> ir.Program. Lowers statements and holes (their arguments,
constraints and the front matter are checked by lang/args.py), expands includes
(lang/include.py) and the files `call()` runs, and runs every static check, reporting all
errors at once as TemplateErrors. The names in it (inputs, captures, set and loop variables,
which inputs are optional, functions and tests) are resolved by lang/names.py, which this
compiler extends. lang/front_end.py runs the whole front end (text to program) for every
face."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from qrun.errors import TemplateErrors
from qrun.lang import ast, ir
from qrun.lang import expr as ex
from qrun.lang.args import MISSING, ArgChecker, count_problem, literal, pattern_name, prefix
from qrun.lang.build import MAX_ERRORS
from qrun.lang.builtins import FUNCTIONS
from qrun.lang.flow import Context, Flow, guards
from qrun.lang.include import Includes
from qrun.lang.lint import find_warnings
from qrun.lang.names import CALL, RUN_TOOL, TOOLS, NameResolver, Signatures, first_spans
from qrun.lang.output import check_output
from qrun.source import Source, Span


def compile_template(template: ast.Template, source: Source, includes: Includes | None = None,
                     functions: Signatures | None = None) -> ir.Program:
    """Check `template` and lower it to the IR; `includes` resolves `{% include %}` (by
    default includes are refused); `functions` are the host functions it may call. The
    program carries the warnings of lang/lint.py.

    Raises:
        TemplateErrors: every TemplateCompileError/ConstraintError found, in source order.
    """
    compiler = _Compiler(source, template, includes or Includes(None), functions or {})
    program = compiler.program(template)
    if compiler.errors:
        raise TemplateErrors(compiler.errors[:MAX_ERRORS])
    return program


class _TooManyErrors(Exception):
    """Stops the walk once MAX_ERRORS errors are collected."""


class _Compiler(NameResolver):
    """Lowers statements and holes; NameResolver (lang/names.py) checks the names in them."""

    def __init__(self, source: Source, template: ast.Template, includes: Includes,
                 functions: Signatures, called: dict[tuple[str, str], ir.Program] | None = None
                 ) -> None:
        super().__init__(source, template, functions)
        self.args = ArgChecker(source, self.errors)
        self.includes = includes
        # The template files `call()` runs, by (calling file, name as written), shared with
        # the compiles of those files (runtime/calls.py finds a call's program there).
        self.called: dict[tuple[str, str], ir.Program] = {} if called is None else called
        if called is None:  # the top template (a called file's compile is inside its)
            self.includes.start(source)
        self.macros: dict[str, ir.Macro] = {}

    def program(self, template: ast.Template) -> ir.Program:
        """The whole template, checked and lowered (what it holds even with errors)."""
        options, model, declared = self.args.front_matter(template.front_matter,
                                                          self.check_new_name)
        self.declared = declared
        flow = Flow()
        try:
            ops = self.body(template.body, flow, Context(), top=True)
        except _TooManyErrors:
            ops = ()
        names = declared if declared is not None else tuple(self.free)
        types = self.args.input_types
        if types:  # typed: required unless declared optional or given a default
            optional = tuple(n for n in names if n in types and not types[n].required)
        else:
            optional = tuple(n for n in names if n in self.safe_uses and n not in self.required)
        spans = {name: self.first_use.get(name) or self.declared_at[name] for name in names}
        output = self.args.output_schema
        if output is not None and not self.errors:
            self.errors.extend(check_output(output, ops, self.captures, self.source,
                                            self.args.output_span, flow.bound))
        warnings = find_warnings(ops, self.source, types) if not self.errors else ()
        return ir.Program(ops, tuple(n for n in names if n not in optional), declared is not None,
                          tuple(self.captures), options, model, self.source, spans, optional,
                          warnings, self.macros, self.host_calls, self.called,
                          {n: t.schema for n, t in types.items()},
                          {n: t.default for n, t in types.items() if t.has_default},
                          output, self.declared_at.copy(), self._tests_block())

    def _tests_block(self) -> ir.TestsBlock | None:
        entry = self.args.tests
        if entry is None:
            return None
        return ir.TestsBlock(entry.data, {**entry.spans, (): entry.span_of(())})

    @property
    def declared_at(self) -> dict[str, Span]:
        """Where the `inputs:` front matter line declares each input (for unused ones)."""
        return self.args.declared_at

    # ---- statements --------------------------------------------------------------------------

    def body(self, nodes: tuple[ast.Node, ...], flow: Flow, ctx: Context, top: bool = False
             ) -> tuple[ir.Op, ...]:
        """`top`: the template's own top level, the one place a macro may be defined."""
        ops: list[ir.Op] = []
        for node in nodes:
            if len(self.errors) >= MAX_ERRORS:
                raise _TooManyErrors
            if isinstance(node, ast.Macro):
                op: ir.Op | None = self.macro(node, top)
            else:
                op = self.node(node, flow, ctx)
            if op is not None:
                ops.append(op)
        return _merge_text(ops)

    def node(self, node: ast.Node, flow: Flow, ctx: Context) -> ir.Op | None:
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
            case ast.Break() | ast.Continue():
                return self.loop_control(node, flow, ctx)
            case ast.Include():
                return self.include(node, flow, ctx)
            case ast.While():
                return self.while_(node, flow, ctx)
            case ast.Try():
                return self.try_(node, flow, ctx)
            case ast.Return(expr=value, span=span):
                self.expr(value, flow, ctx)
                if ctx.macro is None:
                    self.fail("'{% return %}' outside a macro", span,
                              "a template ends where its text ends; a macro's value is what "
                              "`{% return %}` gives")
                elif ctx.particles is not None:
                    self.fail("'{% return %}' cannot leave a '{% particles %}' block", span,
                              f"the block starts at {ctx.particles}; each particle runs its "
                              "whole body")
                elif ctx.branch is not None:
                    # The call has one value; its branches run apart, each to its end.
                    self.fail("'{% return %}' cannot leave a '{% fork %}' branch", span,
                              f"the fork starts at {ctx.branch}; its holes' values are lists "
                              "after it: return them there")
                flow.dead = True
                return ir.Return(value, span)
            case ast.Fork():
                return self.fork(node, flow, ctx)
            case ast.Particles():
                return self.particles(node, flow, ctx)
            case ast.Hidden(body=body, span=span):
                return ir.Hidden(self.body(body, flow, ctx), span)
            case ast.Fresh(body=body, span=span):
                # A new context: chat turns may begin inside, even within an outer turn.
                return ir.Fresh(self.body(body, flow, replace(ctx, role=None)), span)
        return None

    def while_(self, node: ast.While, flow: Flow, ctx: Context) -> ir.While:
        self.expr(node.test, flow, ctx)
        exits: list[Flow] = []
        body_flow = flow.copy()
        body = self.body(node.body, body_flow, replace(ctx, in_loop=True, exits=exits))
        self.after_loop(flow, body_flow, exits)
        return ir.While(node.test, body, node.span)

    def after_loop(self, flow: Flow, body_flow: Flow, exits: list[Flow]) -> None:
        """Captures in a loop's body are lists after the loop; `set`s stay local to the body.
        A capture is bound after the loop when every iteration that reaches the end of the
        body has it (one cut short by break/continue adds no item); when none reaches the
        end, when every break/continue has it."""
        ends = [body_flow] if not body_flow.dead else [f for f in exits if not f.dead]
        end_bound = set.intersection(*(f.bound for f in ends)) if ends else set()
        new_captures = {n for n in body_flow.captured if n not in flow.captured}
        flow.bound |= end_bound & new_captures
        flow.captured.update(body_flow.captured)
        flow.sets.update(body_flow.sets)

    def try_(self, node: ast.Try, flow: Flow, ctx: Context) -> ir.Try:
        """The body may stop anywhere, so after the block holds what both the whole body and
        the handler (from the state before the body) give."""
        body_flow = flow.copy()
        body = self.body(node.body, body_flow, ctx)
        if node.handler is None:
            self.fail("'{% try %}' without '{% except %}'", node.span,
                      "{% try %}...{% except err %}...{% endtry %}: the handler runs with "
                      "`err`, the message, when the body fails")
        handler_ctx = ctx
        where = node.except_span or node.span
        if node.name is not None and self.check_new_name(node.name, where, "except variable"):
            handler_ctx = replace(ctx, locals=ctx.locals | {node.name})
        handler_flow = flow.copy()
        handler = self.body(node.handler or (), handler_flow, handler_ctx)
        flow.merge([body_flow, handler_flow])
        return ir.Try(body, node.name, handler, node.span)

    def macro(self, node: ast.Macro, top: bool) -> ir.Macro | None:
        """A macro's body is compiled once, with its parameters, the template's inputs and
        `set`s in scope (a `set` it reads must have run before the call: checked at run
        time); its captures belong to each call."""
        if not top:
            self.fail("a macro is defined only at the top level of a template", node.span,
                      "move '{% macro %}' out of the block (macros are visible in the whole "
                      "template)")
            return None
        self.check_new_name(node.name, node.name_span, "macro")
        if node.name in FUNCTIONS or node.name in (RUN_TOOL, CALL, TOOLS, *self.host):
            what = "a host function" if node.name in self.host else "a builtin function"
            self.fail(f"macro '{node.name}' has the name of {what}", node.name_span)
        first = self.macro_nodes.get(node.name)
        if first is not None and first is not node:
            self.fail(f"macro '{node.name}' is defined twice", node.name_span,
                      f"first defined at {first.name_span}")
        params: list[ir.Param] = []
        seen: set[str] = set()
        flow = Flow()
        for param in node.params:
            if param.default is not None:  # it may use the parameters before it
                self.expr(param.default, flow, Context(locals=frozenset(seen)))
            elif params and params[-1].default is not None:
                self.fail(f"parameter '{param.name}' without a default after one with a "
                          "default", param.span)
            if self.check_new_name(param.name, param.span, "parameter") and param.name in seen:
                self.fail(f"parameter '{param.name}' appears twice", param.span)
            seen.add(param.name)
            params.append(ir.Param(param.name, param.default))
        ctx = Context(locals=frozenset(seen), defined=frozenset(self.sets), macro=node.name)
        body = self.body(node.body, flow, ctx)
        op = ir.Macro(node.name, tuple(params), body, node.span)
        self.macros.setdefault(node.name, op)
        return op

    def if_(self, node: ast.If, flow: Flow, ctx: Context) -> ir.If:
        branches: list[ir.Branch] = []
        flows: list[Flow] = []
        known = frozenset[str]()  # defined because an earlier arm's test was false
        for arm in node.arms:
            self.expr(arm.test, flow, ctx.knowing(known))
            when_true, when_false = guards(arm.test)
            arm_flow = flow.copy()
            body = self.body(arm.body, arm_flow, ctx.knowing(known | when_true))
            branches.append(ir.Branch(arm.test, body, arm.span))
            flows.append(arm_flow)
            known |= when_false
        else_flow = flow.copy()
        orelse = self.body(node.orelse or (), else_flow, ctx.knowing(known))
        flow.merge([*flows, else_flow])
        return ir.If(tuple(branches), orelse, node.span)

    def for_(self, node: ast.For, flow: Flow, ctx: Context) -> ir.For:
        self.expr(node.iterable, flow, ctx)
        for index, (target, span) in enumerate(zip(node.targets, node.target_spans,
                                                   strict=True)):
            if self.check_new_name(target, span, "loop variable") \
                    and target in node.targets[:index]:
                self.fail(f"loop variable '{target}' appears twice", span)
        exits: list[Flow] = []
        inner = replace(ctx, locals=ctx.locals | {*node.targets, "loop"}, in_loop=True,
                        exits=exits, fork=None)
        body_flow = flow.copy()
        body = self.body(node.body, body_flow, inner)
        self.after_loop(flow, body_flow, exits)
        return ir.For(node.targets, node.iterable, body, node.span)

    def fork(self, node: ast.Fork, flow: Flow, ctx: Context) -> ir.Fork:
        """A fork's body is checked as a loop's (its captures are lists, `loop` is bound), but
        no break or continue crosses it: each branch runs the whole body."""
        self.expr(node.iterable, flow, ctx)
        for index, (target, span) in enumerate(zip(node.targets, node.target_spans,
                                                   strict=True)):
            if self.check_new_name(target, span, "fork variable") \
                    and target in node.targets[:index]:
                self.fail(f"fork variable '{target}' appears twice", span)
        inner = replace(ctx, locals=ctx.locals | {*node.targets, "loop"}, in_loop=True,
                        exits=None, fork=node.span, branch=node.span)
        body_flow = flow.copy()
        body = self.body(node.body, body_flow, inner)
        self.after_branches(flow, body_flow)
        return ir.Fork(node.targets, node.iterable, body, node.span)

    def particles(self, node: ast.Particles, flow: Flow, ctx: Context) -> ir.Particles:
        """The body runs whole in each particle (no break, continue or return leaves it), and
        one particle goes on: after the block, names are bound as after a plain block. Its
        holes are checked for what weighing needs (lang/args.py weighing_conflict)."""
        self.expr(node.count, flow, ctx)
        count = literal(node.count)
        problem = None if count is MISSING else count_problem(count)
        if problem is not None:
            self.fail(problem, node.count.span)
        if ctx.particles is not None:
            self.fail("a '{% particles %}' block cannot be inside another", node.span,
                      f"the outer block starts at {ctx.particles}; its particles already "
                      "weigh every hole inside it")
        inner = replace(ctx, exits=None, fork=None, particles=node.span)
        return ir.Particles(node.count, self.body(node.body, flow, inner), node.span)

    def after_branches(self, flow: Flow, body_flow: Flow) -> None:
        """After a fork: its captures are lists, bound when the body binds them (an empty
        fork leaves them empty lists); its `set`s stay local to the body."""
        new_captures = {n for n in body_flow.captured if n not in flow.captured}
        flow.bound |= body_flow.bound & new_captures
        flow.captured.update(body_flow.captured)
        flow.sets.update(body_flow.sets)

    def loop_control(self, node: ast.Break | ast.Continue, flow: Flow, ctx: Context
                     ) -> ir.Break | ir.Continue:
        word = "break" if isinstance(node, ast.Break) else "continue"
        if ctx.exits is None and ctx.particles is not None and ctx.fork is None:
            self.fail(f"'{{% {word} %}}' cannot leave a '{{% particles %}}' block", node.span,
                      f"the block starts at {ctx.particles}; each particle runs its whole "
                      "body")
        elif ctx.exits is None and ctx.fork is not None:
            self.fail(f"'{{% {word} %}}' cannot leave a '{{% fork %}}' branch", node.span,
                      f"the fork starts at {ctx.fork}; each branch runs its whole body",
                      "an '{% if %}' around the rest of the body skips it")
        elif ctx.exits is None:
            notes = ["an included template cannot end the loop it is included in"
                     ] if ctx.in_loop else []
            self.fail(f"'{{% {word} %}}' outside a loop", node.span, *notes)
        else:
            ctx.exits.append(flow.copy())
        flow.dead = True
        return ir.Break(node.span) if word == "break" else ir.Continue(node.span)

    def role(self, node: ast.Role, flow: Flow, ctx: Context) -> ir.Role:
        if ctx.role is not None:
            outer = ctx.role
            self.fail(f"'{{% {node.role} %}}' inside '{{% {outer.role} %}}': roles cannot nest",
                      node.span, f"the '{{% {outer.role} %}}' block starts at {outer.span}")
        tools = self.role_tools(node, flow, ctx)
        body = self.body(node.body, flow, replace(ctx, role=node))
        return ir.Role(node.role, body, node.span, tools)

    def role_tools(self, node: ast.Role, flow: Flow, ctx: Context) -> ex.Expr | None:
        """The `tools=` of `{% system tools=TOOLS %}` (docs/language.md §7.7), the one
        argument a role takes; a literal list is checked now."""
        tools: ex.Expr | None = None
        for arg in node.args:
            self.expr(arg.expr, flow, ctx)
            name_span = prefix(arg.span, len(arg.name))
            if arg.name != "tools":
                self.fail(f"unknown argument '{arg.name}' for {node.role}", name_span,
                          f"{node.role} accepts: tools" if node.role == "system" else
                          "roles take no arguments; the system turn takes tools=")
            elif node.role != "system":
                self.fail(f"tools= is an argument of the system turn, not of {node.role}",
                          name_span, "write {% system tools=TOOLS %}: the chat template "
                          "renders the tools there")
            elif tools is not None:
                self.fail("argument 'tools' given twice", name_span)
            else:
                tools = arg.expr
                self.args.role_tools(arg.expr)
        return tools

    # ---- includes ----------------------------------------------------------------------------

    def include(self, node: ast.Include, flow: Flow, ctx: Context) -> ir.Include | None:
        """The included template's body, compiled where the tag is (its captures and sets
        count as the includer's); errors inside it get a note naming the tag."""
        first_error = len(self.errors)
        loaded = self.includes.load(node, self.source)
        if isinstance(loaded, list):
            self.errors.extend(loaded)
            self.note_included(first_error, node.span)
            return None
        name, source, template = loaded
        for table, found in ((self.holes, first_spans(template.body, ast.Gen, ast.Select)),
                             (self.sets, first_spans(template.body, ast.Set))):
            for key, span in found.items():
                table.setdefault(key, span)
        try:
            with self.includes.entered(source, node.span), self.in_source(
                    source, node.span):
                body = self.body(template.body, flow, replace(ctx, exits=None))
        finally:
            self.note_included(first_error, node.span)
        return ir.Include(name, source, body, node.span)

    @contextmanager
    def in_source(self, source: Source, tag: Span) -> Iterator[None]:
        """Errors are reported in `source`; inputs first used there, at the outermost tag."""
        outer, outer_site = self.source, self.site
        self.source = self.args.source = source
        self.site = outer_site or tag
        try:
            yield
        finally:
            self.source = self.args.source = outer
            self.site = outer_site

    def note_included(self, first_error: int, tag: Span, how: str = "included") -> None:
        """Errors from `first_error` on that lie in another file get a note naming the tag
        (in self.source) that includes (or calls) it."""
        where = f"{how} from {self.source.name}:{tag}"
        for index in range(first_error, len(self.errors)):
            err = self.errors[index]
            if err.source is not self.source:
                self.errors[index] = type(err)(err.message, err.span, err.source,
                                               [*err.notes, where])

    # ---- holes -------------------------------------------------------------------------------

    def hole(self, node: ast.Gen | ast.Select, flow: Flow, ctx: Context
             ) -> ir.Gen | ir.Select | ir.Fork:
        for arg in node.args:
            if pattern_name(arg) is None:
                self.expr(arg.expr, flow, ctx)
        args = self.args.hole_args(node)
        if ctx.particles is not None:
            self.args.check_weighed(node, args, ctx.particles)
        if isinstance(node, ast.Gen):
            samples = args.get("n")
            if samples is None:
                return self.gen(node, args, ctx.in_loop)
            # `gen NAME n=N`: N branches of one hole, the short form of a fork (its capture a
            # list, as a loop's)
            gen = self.gen(node, args, in_loop=True)
            return ir.Fork((), samples.expr, (gen,), node.span, samples=True)
        return self.select(node, args, ctx.in_loop)

    def gen(self, node: ast.Gen, args: dict[str, ast.HoleArg], in_loop: bool) -> ir.Gen:
        def get(key: str) -> ex.Expr | None:
            return args[key].expr if key in args else None

        params = ir.GenParams(
            max_tokens=get("max_tokens"), stop=get("stop"), constraint=self.args.constraint(args),
            **{key: get(key) for key in ir.SAMPLING_FIELDS})
        return ir.Gen(node.name, params, in_loop, node.span)

    def select(self, node: ast.Select, args: dict[str, ast.HoleArg], in_loop: bool
               ) -> ir.Select:
        options = args.get("options")
        # `choices=` (SGLang's spelling) is reported as an unknown argument naming options=.
        if options is None and not any(arg.name == "choices" for arg in node.args):
            self.fail(f"select '{node.name}' needs options=[...]", node.span,
                      'e.g. {{ select color options=["red", "green"] }}')
        temperature, normalize = args.get("temperature"), args.get("normalize")
        return ir.Select(
            node.name, options.expr if options else ex.ListExpr((), node.span),
            temperature.expr if temperature else None, normalize.expr if normalize else None,
            in_loop, node.span)

    # ---- call() ----------------------------------------------------------------------------

    def call_file(self, args: tuple[ex.Expr, ...], kwargs: tuple[tuple[str, ex.Expr], ...],
                  span: Span) -> None:
        """`call("file.tmpl", name=value, ...)`: the file is found as `{% include %}` finds
        one (lang/include.py: relative to the calling file, inside the include folder) and
        compiled now, as a template of its own whose inputs the keyword arguments give."""
        first = args[0] if args else None
        if not isinstance(first, ex.Const) or not isinstance(first.value, str) or len(args) > 1:
            self.fail("call() takes the template file's name as a string literal, then its "
                      "inputs by name", span, 'e.g. call("summary.tmpl", text=doc)')
            return
        key = (self.source.name, first.value)
        program = self.called.get(key)
        if program is None:
            first_error = len(self.errors)
            loaded = self.includes.load(ast.Include(first, span), self.source)
            if isinstance(loaded, list):
                self.errors.extend(loaded)
                self.note_included(first_error, span, "called")
                return
            _, source, template = loaded
            inner = _Compiler(source, template, self.includes, self.host, self.called)
            with self.includes.entered(source, span):
                program = inner.program(template)
            self.errors.extend(inner.errors)
            self.note_included(first_error, span, "called")
            if inner.errors:
                return
            self.called[key] = program
            for name in program.captures:
                if name not in self.captures:  # a run that calls holes needs the model
                    self.captures.append(name)
        given = [name for name, _ in kwargs]
        missing = [name for name in program.inputs if name not in given]
        if missing:
            self.fail(f"call({ex.literal_text(first.value)}) is missing input"
                      f"{'s' if len(missing) > 1 else ''} " + ", ".join(map(repr, missing)),
                      span)
        known = {*program.inputs, *program.optional_inputs}
        for name in given:
            if name not in known:
                self.fail(f"{first.value} has no input '{name}'", span,
                          "its inputs: " + (", ".join(sorted(known)) or "none"))


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
