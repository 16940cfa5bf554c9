"""The IR: what the runtime executes. compile_template(ast) -> Program; execute(Program) runs it.
Ops are frozen, positioned, and closed under the union `Op`; lang/ir_dump.py prints them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from qrun.constraint.spec import DFA, LLGUIDANCE, ConstraintSpec
from qrun.errors import InputError, TemplateWarning
from qrun.lang.declared import first_problem, where
from qrun.lang.expr import Expr
from qrun.lang.inputs import CheckedInputs, plain_inputs
from qrun.options import SAMPLING_OPTIONS, ModelOptions, RunOptions
from qrun.source import Source, Span


@dataclass(frozen=True, slots=True)
class EmitText:
    """Fixed text inserted into the context verbatim (whitespace control already applied)."""

    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class EmitValue:
    """Interpolation `{{ expr }}`: str(value) inserted as fixed text."""

    expr: Expr
    span: Span


# A hole's constraint compiles with one of two engines (qrun/constraint/spec.py DFA and
# LLGUIDANCE): qrun's byte DFA for regexes and named patterns, llguidance for JSON Schemas
# and Lark grammars. A constraint written as a literal is lowered by the compiler
# (qrun/lang/args.py) and its spec kept in `lowered`, so a run does not evaluate, check or
# write it again; one computed by the template is lowered when its hole comes.


@dataclass(frozen=True, slots=True)
class Regex:
    """A regex constraint: `pattern` (an expression, usually a Const str) must full-match the
    value. `stdlib_name` is set when the user wrote a named pattern such as `regex=INT`."""

    pattern: Expr
    stdlib_name: str | None = None
    engine: str = DFA
    lowered: ConstraintSpec | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class JsonSchema:
    """The value must be JSON valid against the schema (an expression giving a dict, a bool or
    a JSON string); `formats` (an expression giving "assert", "known" or "annotation") says
    how `format` keywords are read (qrun/constraint/grammar/formats.py); `closed` (an
    expression giving a bool) forbids properties the schema's
    objects do not list."""

    schema: Expr
    closed: Expr | None = None
    formats: Expr | None = None
    engine: str = LLGUIDANCE
    lowered: ConstraintSpec | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Grammar:
    """The value must be a sentence of a Lark grammar in llguidance's dialect (an expression
    giving the grammar text)."""

    grammar: Expr
    engine: str = LLGUIDANCE
    lowered: ConstraintSpec | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The value is a call to one of `tools` (an expression giving a list of tools in OpenAI's
    function format, qrun/constraint/tools.py): JSON `{"name": ..., "arguments": ...}` with a
    name from the list and arguments valid under that tool's parameters, in the model's own
    tool-call format where its chat template has one (runtime/tool_calls.py). Its value is the
    dict `{"name": str, "arguments": dict}`. `closed` and `formats` read the parameters as
    they read a json= schema (closed unless `closed` gives false)."""

    tools: Expr
    closed: Expr | None = None
    formats: Expr | None = None
    engine: str = LLGUIDANCE
    lowered: ConstraintSpec | None = field(default=None, compare=False, repr=False)


Constraint = Regex | JsonSchema | Grammar | ToolCall


SAMPLING_FIELDS = (*SAMPLING_OPTIONS, "seed", "heal", "keep_stop", "ends_at_text", "sampler",
                   "particles", "ess_threshold")
"""GenParams' arguments after its length, stop and constraint, in field order."""


@dataclass(frozen=True, slots=True)
class GenParams:
    """A `gen` hole's arguments as expressions (None = not given, the run default applies).
    Literal arguments were type-checked by the compiler; others are checked when evaluated."""

    max_tokens: Expr | None = None
    stop: Expr | None = None
    constraint: Constraint | None = None
    temperature: Expr | None = None
    top_p: Expr | None = None
    top_k: Expr | None = None
    min_p: Expr | None = None
    presence_penalty: Expr | None = None
    frequency_penalty: Expr | None = None
    repetition_penalty: Expr | None = None
    logit_bias: Expr | None = None
    seed: Expr | None = None
    heal: Expr | None = None
    keep_stop: Expr | None = None  # the stop string that ended the value stays in it
    # false: the model beginning the next text does not end the hole (docs/language.md §14.5)
    ends_at_text: Expr | None = None
    # "mask" (token by token under the mask), "exact" (the model's conditional over a small
    # language, scored whole: runtime/exact.py) or "smc" (particles: runtime/particles.py)
    sampler: Expr | None = None
    particles: Expr | None = None  # how many, with sampler="smc"
    ess_threshold: Expr | None = None  # when sampler="smc" resamples (a share of N)

    def exprs(self) -> Iterator[Expr]:
        """Every argument expression, the constraint's included, in field order."""
        for value in (self.max_tokens, self.stop):
            if value is not None:
                yield value
        match self.constraint:
            case Regex(pattern=pattern):
                yield pattern
            case JsonSchema(schema=schema, closed=closed, formats=formats) | ToolCall(
                    tools=schema, closed=closed, formats=formats):
                yield schema
                if closed is not None:
                    yield closed
                if formats is not None:
                    yield formats
            case Grammar(grammar=grammar):
                yield grammar
            case None:
                pass
        for key in SAMPLING_FIELDS:
            value = getattr(self, key)
            if value is not None:
                yield value


@dataclass(frozen=True, slots=True)
class Gen:
    """A generated hole captured as `name`; inside a loop (`in_loop`) it captures a list."""

    name: str
    params: GenParams
    in_loop: bool
    span: Span


@dataclass(frozen=True, slots=True)
class Select:
    """A hole whose value is one of `options` (an expression giving a list of str)."""

    name: str
    options: Expr
    temperature: Expr | None
    normalize: Expr | None
    in_loop: bool
    span: Span


@dataclass(frozen=True, slots=True)
class Branch:
    """One `if`/`elif` arm: run `body` when `condition` is truthy."""

    condition: Expr
    body: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class If:
    """`if/elif/else`: the first branch whose condition holds runs, else `orelse`."""

    branches: tuple[Branch, ...]
    orelse: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class For:
    """`for target in iterable`: body runs once per item with `targets` and `loop` bound (two
    or more targets unpack each item, `for k, v in d.items()`); Break and Continue in the body
    end the loop or the iteration."""

    targets: tuple[str, ...]
    iterable: Expr
    body: tuple[Op, ...]
    span: Span

    def __post_init__(self) -> None:
        assert self.targets, "a loop binds at least one name"


@dataclass(frozen=True, slots=True)
class Break:
    """`{% break %}`: leave the innermost loop (the compiler allows it only in a loop body)."""

    span: Span


@dataclass(frozen=True, slots=True)
class Continue:
    """`{% continue %}`: end this iteration of the innermost loop."""

    span: Span


@dataclass(frozen=True, slots=True)
class Include:
    """`{% include "name" %}`: the ops of the included template, inlined where the tag is
    (`span`); their spans point into `source`, the included file."""

    name: str
    source: Source
    body: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Set:
    """`set name = expr`."""

    name: str
    expr: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Role:
    """A chat turn: `role` is "system", "user" or "assistant"; body is wrapped in the model's
    chat-template markers. `tools` (a system turn's, an expression giving a list of tools)
    are rendered into the turn as the chat template renders them (runtime/tool_calls.py)."""

    role: str
    body: tuple[Op, ...]
    span: Span
    tools: Expr | None = None


@dataclass(frozen=True, slots=True)
class While:
    """`while test`: body runs while `test` is truthy, each round charged to the run's
    budget (which bounds a loop that never ends); Break and Continue work as in For."""

    test: Expr
    body: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Fork:
    """`{% fork target in iterable %}`: `body` runs once per item as an independent branch
    from the context before the block (its KV cache forked, not fed again), the branches
    advanced together (runtime/branches.py) with `targets` and `loop` bound as in For; their
    captures are lists in item order, their text is in neither the context nor the result.
    `samples` (`{{ gen NAME n=N }}`): `iterable` gives the count N of branches, and `targets`
    is empty."""

    targets: tuple[str, ...]
    iterable: Expr
    body: tuple[Op, ...]
    span: Span
    samples: bool = False

    def __post_init__(self) -> None:
        assert self.samples or self.targets, "a fork over a list binds at least one name"


@dataclass(frozen=True, slots=True)
class Particles:
    """`{% particles count %}`: `body` runs as `count` particles, branches from the context
    before the block as a fork's (runtime/particle_block.py), each weighed by how much of the
    model's probability its holes' constraints kept; one particle, drawn by weight, goes on:
    its captures, text and context are the run's after the block (docs/language.md §23.5)."""

    count: Expr
    body: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Hidden:
    """`{% hidden %}`: `body` runs in the context, then the context is taken back to where the
    block began (the KV cache cropped); its captures stay, its text is not in the result."""

    body: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Try:
    """`try`/`except name`: run `body`; when an EvaluationError (a host function failing,
    any expression failing; not a GenerationError, not a limit) ends it, the text it emitted
    is taken back from the context and `handler` runs with `name` (if any) bound to the
    error's message."""

    body: tuple[Op, ...]
    name: str | None
    handler: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Param:
    """A macro parameter; `default` is evaluated at each call that does not give it."""

    name: str
    default: Expr | None


@dataclass(frozen=True, slots=True)
class Macro:
    """`macro name(params)`: defined where written (top level only), runs where called
    (runtime/calls.py); the op itself does nothing."""

    name: str
    params: tuple[Param, ...]
    body: tuple[Op, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Return:
    """`return expr`: ends the macro being run; its value is the call's value."""

    expr: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Fresh:
    """`{% fresh %}`: `body` runs in a new, empty context; the context before the block then
    goes on untouched (its KV cache kept). Its captures stay, its text is not in the result."""

    body: tuple[Op, ...]
    span: Span


Op = (EmitText | EmitValue | Gen | Select | If | For | Set | Role | Break | Continue | Include
      | While | Try | Macro | Return | Fork | Particles | Hidden | Fresh)


@dataclass(frozen=True, slots=True)
class TestsBlock:
    """The front matter's `tests:`: its data, and the span of a part of it by path (the
    part's, or of the nearest part above it that has one)."""

    data: Any
    spans: Mapping[tuple[str | int, ...], Span]

    def span_of(self, path: tuple[str | int, ...]) -> Span:
        while path not in self.spans and path:
            path = path[:-1]
        return self.spans[path]


@dataclass(frozen=True, slots=True)
class Program:
    """A compiled template. `inputs` are the names a run must supply (declared in front matter
    when `inputs_declared`, else the template's free variables), `input_spans` where each is
    first used (or declared, when never used); `optional_inputs` those a run may leave out (used
    only under `is defined` or through `default`: absent, they are undefined); `captures` the
    hole names; `options` and `model` the front matter's run options and model; `warnings`
    what the compiler found suspicious but not wrong (docs/language.md §13), in source order."""

    ops: tuple[Op, ...]
    inputs: tuple[str, ...]
    inputs_declared: bool
    captures: tuple[str, ...]
    options: RunOptions
    model: ModelOptions  # model, device and dtype at most; the caller's choice wins
    source: Source = field(compare=False)
    input_spans: dict[str, Span] = field(default_factory=dict, compare=False)
    optional_inputs: tuple[str, ...] = ()
    warnings: tuple[TemplateWarning, ...] = field(default=(), compare=False)
    # The template's macros by name, and the host functions it calls with their call sites
    # (a run checks the registry it is given has them: runtime/calls.py).
    macros: Mapping[str, Macro] = field(default_factory=dict, compare=False)
    host_calls: Mapping[str, Span] = field(default_factory=dict, compare=False)
    # The template files `call()` runs: (calling file's name, name as written) -> program.
    called: Mapping[tuple[str, str], Program] = field(default_factory=dict, compare=False)
    # Typed front matter (docs/language.md §4.1): each typed input's JSON Schema, the
    # defaults of those that have one, the result record's schema (`output:`), and where
    # each input is declared.
    input_types: Mapping[str, Any] = field(default_factory=dict, compare=False)
    input_defaults: Mapping[str, Any] = field(default_factory=dict, compare=False)
    output_schema: Mapping[str, Any] | None = field(default=None, compare=False)
    declared_at: Mapping[str, Span] = field(default_factory=dict, compare=False)
    # The front matter's `tests:` as YAML read it, and where each part of it is (by its path
    # of keys and indexes): `qrun test`'s cases (docs/testing.md §1); None without one.
    tests: TestsBlock | None = field(default=None, compare=False)

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of a run's inputs as an object: typed inputs with their schemas,
        untyped ones as any value; required as a run requires them."""
        properties = {name: dict(self.input_types.get(name, {}))
                      for name in (*self.inputs, *self.optional_inputs)}
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if self.inputs:
            schema["required"] = list(self.inputs)
        return schema

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs the template reads (the optional ones that are given), as plain data
        (lang/inputs.py), checked before any model work; a missing one is reported where it is
        first used. What this returns is returned as it is when checked again.

        Raises:
            InputError: an input is missing.
            UsageError: an input is not plain data (a function, an object, a cycle...).
        """
        if isinstance(inputs, CheckedInputs) and inputs.checked_by is self:
            return inputs
        missing = [name for name in self.inputs if name not in inputs]
        if not missing:
            given = [*self.inputs, *(n for n in self.optional_inputs if n in inputs)]
            checked = CheckedInputs(plain_inputs({name: inputs[name] for name in given}))
            self._check_types(checked)
            for name, default in self.input_defaults.items():
                if name not in checked:
                    checked[name] = copy.deepcopy(default)
            checked.checked_by = self
            return checked
        first = missing[0]
        span = self.input_spans.get(first) or self.source.span_at(0)
        names = ", ".join(repr(m) for m in missing)
        # JSON written into a template: its null is a name here, Jinja's literal is `none`.
        json_null = ["did you mean `none`? JSON's null is written `none` here "
                     "(docs/language.md §6)"] if first == "null" else []
        raise InputError(
            f"missing input{'s' if len(missing) > 1 else ''} {names}", span, self.source,
            notes=[*json_null,
                   f"give it with -v {first}=VALUE, --vars FILE.json, or run({first}=...)",
                   f"an input used only under `{{% if {first} is defined %}}` or through "
                   f"`{first} | default(...)` is optional"])

    def _check_types(self, inputs: Mapping[str, Any]) -> None:
        """Each typed input given fits its declared JSON Schema.

        Raises:
            InputError: naming the input and the path inside it, at its declaration.
        """
        for name, schema in self.input_types.items():
            if name not in inputs:
                continue
            problem = first_problem(schema, inputs[name])
            if problem is not None:
                path, message = problem
                span = self.declared_at.get(name) or self.source.span_at(0)
                raise InputError(f"input '{name}'{where(path)}: {message}", span, self.source,
                                 notes=[f"'{name}' is declared as {json.dumps(schema)}"])


# ---- traversal: the one walk over op trees (compiler, executor and tests use these) -------------


def children(op: Op) -> Iterator[Op]:
    """The ops nested directly in `op` (branch bodies in order, then the else body)."""
    match op:
        case If(branches=branches, orelse=orelse):
            for branch in branches:
                yield from branch.body
            yield from orelse
        case (For(body=body) | Role(body=body) | Include(body=body) | While(body=body)
              | Macro(body=body) | Fork(body=body) | Particles(body=body) | Hidden(body=body)
              | Fresh(body=body)):
            yield from body
        case Try(body=body, handler=handler):
            yield from body
            yield from handler
        case (EmitText() | EmitValue() | Gen() | Select() | Set() | Break() | Continue()
              | Return()):
            pass


def walk(ops: Iterable[Op]) -> Iterator[Op]:
    """Every op in `ops` and below, depth first, in source order."""
    for op in ops:
        yield op
        yield from walk(children(op))


def walk_sources(ops: Iterable[Op], source: Source) -> Iterator[tuple[Op, Source]]:
    """As walk, with the Source each op's spans point into (`source` for `ops`, an included
    file's for the ops of an Include)."""
    for op in ops:
        yield op, source
        inner = op.source if isinstance(op, Include) else source
        yield from walk_sources(children(op), inner)


def holes(ops: Iterable[Op], source: Source, macros: bool = False, forks: bool = True
          ) -> Iterator[tuple[Gen | Select, Source]]:
    """Every gen and select hole in `ops` and below, depth first in source order, with the
    Source its spans point into (an included file's inside an Include). A macro's holes run
    only in its calls, with captures of their own: left out unless `macros`. A fork's (and
    `gen n=`'s, and a particles block's) run in branches side by side: left out when not
    `forks`. The one walk every module that looks for holes uses."""
    for op in ops:
        if isinstance(op, Macro) and not macros or isinstance(op, Fork | Particles) and not forks:
            continue
        if isinstance(op, Gen | Select):
            yield op, source
        inner = op.source if isinstance(op, Include) else source
        yield from holes(children(op), inner, macros, forks)


def exprs(op: Op) -> Iterator[Expr]:
    """The expressions `op` itself evaluates (not those of nested ops), in source order."""
    match op:
        case EmitValue(expr=value) | Set(expr=value) | Return(expr=value):
            yield value
        case (For(iterable=iterable) | While(test=iterable) | Fork(iterable=iterable)
              | Particles(count=iterable)):
            yield iterable
        case Macro(params=params):
            yield from (p.default for p in params if p.default is not None)
        case If(branches=branches):
            for branch in branches:
                yield branch.condition
        case Select(options=options, temperature=temperature, normalize=normalize):
            yield from (e for e in (options, temperature, normalize) if e is not None)
        case Gen(params=params):
            yield from params.exprs()
        case Role(tools=tools):
            if tools is not None:
                yield tools
        case EmitText() | Break() | Continue() | Include() | Try() | Hidden() | Fresh():
            pass
