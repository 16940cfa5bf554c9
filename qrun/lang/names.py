"""Name and flow resolution over a template's expressions (Jinja's idtracking.py beside its
compiler): which names are inputs (and which optional), captures, `set` and loop variables;
that each use is bound on every path that reaches it; and that functions, macros, host
functions, tests, methods and attributes exist and are called as they take. lang/compiler.py
extends the resolver with the lowering of statements and holes; lang/flow.py holds the
per-path state (Flow) and the guards of tests."""

from __future__ import annotations

from collections.abc import Mapping

from qrun.errors import TemplateCompileError, TemplateError, suggest
from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.lang.builtins import FUNCTIONS, METHODS, TESTS, UNDEFINED_TESTS, keyword_error
from qrun.lang.evaluate import HOLE_ENDING_FIELDS, LOOP_FIELDS, refused_name
from qrun.lang.flow import Context, Flow, guards
from qrun.lang.signature import Signature
from qrun.lang.surface import FILTER_HINTS, METHOD_HINTS, STRING_FORMAT_HINT, TEST_HINTS
from qrun.source import Source, Span

Signatures = Mapping[str, Signature]
"""The host functions a template may call, by name (qrun/functions.py Functions.signatures)."""
CALL = "call"
"""The builtin that runs another template file: call("file.tmpl", name=value, ...)."""
RUN_TOOL = "run_tool"
"""The builtin that runs a tool call `{name, arguments}` with the host function it names."""
TOOLS = "tools"
"""The builtin that gives the registered host functions as OpenAI tool specs (all, or the
named ones): `{{ gen action tools=tools(["calc"]) }}`."""
_HOST_NOTE = ("a host function is known only when registered: Query(text, functions=...), "
              "or `qrun FILE --functions FILE.py` (docs/language.md §22)")


class NameResolver:
    """The names of one template (an included file's body counts as its includer's; a file
    that `call()` runs gets a resolver of its own). Errors collect in `errors`, reported in
    `source`, the file being read now."""

    def __init__(self, source: Source, template: ast.Template, functions: Signatures) -> None:
        self.source = source
        self.errors: list[TemplateError] = []
        self.declared: tuple[str, ...] | None = None
        self.free: list[str] = []  # inputs discovered as free variables, in first-use order
        self.first_use: dict[str, Span] = {}  # where each input is first used
        self.required: set[str] = set()  # inputs used where an undefined value is an error
        self.safe_uses: set[str] = set()  # ... and where it is not (`is defined`, `default`)
        self.captures: list[str] = []
        self.holes = first_spans(template.body, ast.Gen, ast.Select)  # for "captured later"
        self.sets = first_spans(template.body, ast.Set)
        self.site: Span | None = None  # the outermost include tag, inside an included file
        self.host = dict(functions)
        self.host_calls: dict[str, Span] = {}  # host functions called, at their first call
        # Every top-level macro is visible in the whole template (and in each macro's body).
        self.macro_nodes = {node.name: node for node in template.body
                            if isinstance(node, ast.Macro)}

    def fail(self, message: str, span: Span, *notes: str) -> None:
        self.errors.append(TemplateCompileError(message, span, self.source, notes))

    def call_file(self, args: tuple[ex.Expr, ...], kwargs: tuple[tuple[str, ex.Expr], ...],
                  span: Span) -> None:
        """`call("file.tmpl", ...)`: compiling the called file is the compiler's job
        (lang/compiler.py), which overrides this."""
        raise NotImplementedError

    # ---- names -------------------------------------------------------------------------------

    def check_new_name(self, name: str, span: Span, what: str) -> bool:
        if refused_name(name) is not None:
            self.fail(f"{what} '{name}': names may not start with '_' or contain '__'", span)
            return False
        if name in ("loop", "holes"):
            role = "the loop variable" if name == "loop" else "how the holes so far ended"
            article = "an" if what[0] in "aeiou" else "a"
            self.fail(f"'{name}' is reserved for {role} and cannot be {article} {what}", span)
            return False
        return True

    def capture(self, name: str, span: Span, flow: Flow, ctx: Context) -> None:
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

    def assign(self, name: str, span: Span, flow: Flow, ctx: Context) -> None:
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

    def use(self, name: str, span: Span, flow: Flow, ctx: Context, safe: bool = False
            ) -> None:
        """A use of `name`; `safe` when an undefined value is fine there (the operand of `is
        defined` or of `default`), as is any use a test guards (`ctx.defined`)."""
        refused = refused_name(name)
        if refused is not None:
            self.fail(refused, span)
            return
        if name in ctx.locals or name in flow.bound or name == "holes":
            return
        safe = safe or name in ctx.defined
        if self.is_input(name):
            self.input_use(name, span, safe)
            return
        if ctx.macro is not None and name in self.holes and name not in flow.captured:
            self.fail(f"macro '{ctx.macro}' cannot see the capture '{name}'", span,
                      "a macro sees its parameters, the inputs and the template's `set` "
                      f"variables: pass it as an argument, {ctx.macro}({name}=...)")
            return
        known = (flow.captured, flow.sets, self.holes, self.sets)
        if safe and any(name in names for names in known):
            return  # undefined until it is captured or set: `is defined` tells
        if name in flow.captured:
            self.fail(f"'{name}' is not captured on every path that reaches here", span,
                      f"it is captured at {flow.captured[name]}",
                      f"test it with `{{% if {name} is defined %}}`")
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
            known_names = [*self.declared, *flow.bound, *ctx.locals]
            self.fail(f"unknown variable '{name}'", span, *suggest(name, known_names),
                      "declared inputs: " + (", ".join(self.declared) or "none"))
        else:
            self.free.append(name)
            self.input_use(name, span, safe)

    def hole_use(self, name: str, span: Span, flow: Flow, ctx: Context, safe: bool) -> None:
        """`holes.NAME`: how hole NAME ended (docs/language.md §7.6), known where the capture
        NAME is (a loop variable of that name does not make it known)."""
        if name not in self.holes:
            self.fail(f"'holes' has no hole '{name}'", span, *suggest(name, self.holes),
                      "holes: " + (", ".join(self.holes) or "none"))
        elif name in flow.bound or safe or name in ctx.defined:
            return
        elif name in flow.captured:
            self.fail(f"'{name}' is not captured on every path that reaches here", span,
                      f"it is captured at {flow.captured[name]}",
                      f"test it with `{{% if holes.{name} is defined %}}`")
        else:
            self.fail(f"'{name}' is used before it is captured", span,
                      f"it is captured at {self.holes[name]}")

    def input_use(self, name: str, span: Span, safe: bool) -> None:
        self.first_use.setdefault(name, self.site or span)
        (self.safe_uses if safe else self.required).add(name)

    # ---- expressions -------------------------------------------------------------------------

    def expr(self, node: ex.Expr, flow: Flow, ctx: Context, safe: bool = False) -> None:
        """Check names, attributes, calls and tests in `node` (recursively); `safe`: an
        undefined value of `node` itself is fine (see use)."""
        kids = list(ex.children(node))
        match node:
            case ex.Name(name=name, span=span):
                self.use(name, span, flow, ctx, safe)
            case ex.Attr(obj=ex.Name(name="holes"), attr=attr, span=span):
                self.hole_use(attr, span, flow, ctx, safe)
                return
            case ex.Attr(obj=obj, attr=attr, span=span):
                self.attr(obj, attr, span, ctx)
            case ex.Call(func="call", args=args, kwargs=kwargs, span=span) \
                    if CALL not in self.macro_nodes:
                self.call_file(args, kwargs, span)
                kids = [value for _, value in kwargs]
            case ex.Call(func=func, args=args, kwargs=kwargs, span=span):
                self.function(func, len(args), kwargs, span)
                if func == "default" and kids:  # default(x, ...): x may be undefined
                    self.expr(kids.pop(0), flow, ctx, safe=True)
            case ex.Filter(name=func, args=args, kwargs=kwargs, span=span):
                self.function(func, len(args) + 1, kwargs, span)
                if func == "default" and kids:  # x | default(...): x may be undefined
                    self.expr(kids.pop(0), flow, ctx, safe=True)
                if func == "default" and kids:  # default(x, ...): x may be undefined
                    self.expr(kids.pop(0), flow, ctx, safe=True)
            case ex.Test(name=test, args=args, span=span):
                self.test(test, args, span)
                self.expr(kids.pop(0), flow, ctx, safe=test in UNDEFINED_TESTS)
            case ex.Method():
                self.method(node)
            case ex.Binary(op="%", left=ex.Const(value=str()), span=span):
                self.fail("'%' does not format strings", span, STRING_FORMAT_HINT)
            case ex.BoolOp(op=op, values=values):
                self.bool_op(op, values, flow, ctx)
                return
            case ex.Cond(body=body, test=test, orelse=orelse):
                self.expr(test, flow, ctx)
                when_true, when_false = guards(test)
                self.expr(body, flow, ctx.knowing(when_true))
                self.expr(orelse, flow, ctx.knowing(when_false))
                return
        for child in kids:
            self.expr(child, flow, ctx)

    def bool_op(self, op: str, values: tuple[ex.Expr, ...], flow: Flow, ctx: Context
                ) -> None:
        """`a and b`: b is checked knowing what a's truth guarantees; `a or b`: its falsity."""
        known = frozenset[str]()
        for value in values:
            self.expr(value, flow, ctx.knowing(known))
            when_true, when_false = guards(value)
            known |= when_true if op == "and" else when_false

    def attr(self, obj: ex.Expr, attr: str, span: Span, ctx: Context) -> None:
        if attr.startswith("_"):
            self.fail(f"attributes starting with '_' are not allowed: '{attr}'", span)
        elif isinstance(obj, ex.Attr) and isinstance(obj.obj, ex.Name) \
                and obj.obj.name == "holes" and attr not in HOLE_ENDING_FIELDS:
            # `holes` is reserved (check_new_name), so this is always how a hole ended.
            self.fail(f"'holes.{obj.attr}' has no attribute '{attr}'", span,
                      *suggest(attr, HOLE_ENDING_FIELDS),
                      "how a hole ended: " + ", ".join(HOLE_ENDING_FIELDS)
                      + " (docs/language.md §7.6; a select's option probabilities are in "
                        "the run's result)")
        elif isinstance(obj, ex.Name) and obj.name == "loop" and "loop" in ctx.locals \
                and attr not in LOOP_FIELDS:
            self.fail(f"'loop' has no attribute '{attr}'", span,
                      *suggest(attr, LOOP_FIELDS), "loop attributes: " + ", ".join(LOOP_FIELDS))

    def function(self, func: str, positional: int, kwargs: tuple[tuple[str, ex.Expr], ...],
                 span: Span) -> None:
        signature = self.signature(func)
        if func in (RUN_TOOL, TOOLS) and not self.host:
            # Without host functions run_tool could only fail and tools() would offer none.
            self.fail(f"{func}() needs host functions, and none are registered", span,
                      _HOST_NOTE)
            return
        if func not in FUNCTIONS and signature is not None:
            refused = signature.check(func, positional, tuple(name for name, _ in kwargs))
            if refused is not None:
                self.fail(refused, span)
            if func in self.host:
                self.host_calls.setdefault(func, span)
            return
        if func not in FUNCTIONS:
            hint = FILTER_HINTS.get(func)
            known = [*FUNCTIONS, *self.macro_nodes, *self.host]
            notes = [hint] if hint else [*suggest(func, known), _HOST_NOTE]
            self.fail(f"unknown function '{func}'", span, *notes,
                      "functions: " + ", ".join(FUNCTIONS))
            return
        for name, _ in kwargs:
            refused = keyword_error(func, name)
            if refused is not None:
                self.fail(refused, span)

    def signature(self, func: str) -> Signature | None:
        """How a macro, a host function or run_tool is called (None for other names)."""
        macro = self.macro_nodes.get(func)
        if macro is not None:
            required = sum(1 for p in macro.params if p.default is None)
            return Signature(tuple(p.name for p in macro.params), required)
        if func == RUN_TOOL:
            return Signature(("call",), 1)
        if func == TOOLS:
            return Signature(("names",), 0)
        return self.host.get(func)

    def test(self, test: str, args: tuple[ex.Expr, ...], span: Span) -> None:
        if test not in TESTS:
            hint = TEST_HINTS.get(test)
            self.fail(f"unknown test '{test}'", span, *([hint] if hint else suggest(test, TESTS)),
                      "tests: " + ", ".join(TESTS))
        elif args:
            self.fail(f"the test '{test}' takes no arguments", span)

    def method(self, node: ex.Method) -> None:
        if node.name not in METHODS:
            hint = METHOD_HINTS.get(node.name)
            self.fail(f"method calls are not supported: '.{node.name}()'", node.span,
                      *([hint] if hint else []),
                      "the only methods are a dict's items(), keys() and values()")
        elif node.args or node.kwargs:
            self.fail(f"{node.name}() takes no arguments", node.span)


def first_spans(nodes: tuple[ast.Node, ...], *kinds: type[ast.Gen | ast.Select | ast.Set]
                 ) -> dict[str, Span]:
    """Name -> span of its first hole (or `set`) among `kinds`, in source order."""
    found: dict[str, Span] = {}
    for node in ast.walk(nodes):
        if isinstance(node, kinds):
            found.setdefault(node.name, node.name_span)
    return found
