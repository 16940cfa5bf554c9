"""The IR: what the runtime executes. compile_template(ast) -> Program; execute(Program) runs it.
Ops are frozen, positioned, and closed under the union `Op`; Program.dump() is deterministic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qrun.lang.expr import Expr
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


@dataclass(frozen=True, slots=True)
class Regex:
    """A regex constraint: `pattern` (an expression, usually a Const str) must full-match the
    value. `stdlib_name` is set when the user wrote a named pattern such as `regex=INT`."""

    pattern: Expr
    stdlib_name: str | None = None


@dataclass(frozen=True, slots=True)
class JsonSchema:
    """The value must be JSON valid against the schema (an expression giving a dict)."""

    schema: Expr


Constraint = Regex | JsonSchema


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
    seed: Expr | None = None
    heal: Expr | None = None


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
    """`for target in iterable`: body runs once per item with `target` and `loop` bound."""

    target: str
    iterable: Expr
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
    chat-template markers."""

    role: str
    body: tuple[Op, ...]
    span: Span


Op = EmitText | EmitValue | Gen | Select | If | For | Set | Role


@dataclass(frozen=True, slots=True)
class RunDefaults:
    """Front-matter defaults for a run (None = not given)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    device: str | None = None
    dtype: str | None = None


@dataclass(frozen=True, slots=True)
class Program:
    """A compiled template. `inputs` are the names a run must supply (declared in front matter
    when `inputs_declared`, else the template's free variables); `captures` the hole names."""

    ops: tuple[Op, ...]
    inputs: tuple[str, ...]
    inputs_declared: bool
    captures: tuple[str, ...]
    defaults: RunDefaults
    source: Source = field(compare=False)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def dump(self) -> str:
        """One op per line with its source position, nested blocks indented; deterministic."""
        from qrun.lang.dump import dump_program

        return dump_program(self)
