"""The AST: what the user wrote, one frozen node per surface construct, each with a Span.
Built from the parse tree by lang/build.py (shape only); checked and lowered to the IR by
lang/compiler.py. Comments are gone and whitespace control is applied already."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from qrun.lang.expr import Expr
from qrun.source import Span


@dataclass(frozen=True, slots=True)
class FrontMatterEntry:
    """One `key: value` entry of the front matter's YAML mapping (lang/front_matter.py).
    `value` is the value's text as written and `value_span` covers it; `data` is the value as
    YAML reads it (str, int, float, bool, None, lists and dicts of them); `scalar` a scalar's
    text unquoted (None for a list or mapping: the compiler types run options from it as the
    `key: value` lines before YAML were read); `spans` where each part of `data` is, by its
    path of keys and indexes (`()` is the value itself), and `keys` where each mapping key is,
    by the path of its value."""

    key: str
    value: str
    span: Span
    value_span: Span
    data: Any = None
    scalar: str | None = None
    spans: Mapping[tuple[str | int, ...], Span] = field(default_factory=dict, compare=False)
    keys: Mapping[tuple[str | int, ...], Span] = field(default_factory=dict, compare=False)

    def span_of(self, path: tuple[str | int, ...], key: bool = False) -> Span:
        """The span of the part at `path` (of its key, with `key`), or of the nearest part
        above it that has one."""
        table = self.keys if key else self.spans
        while path:
            if path in table:
                return table[path]
            path = path[:-1]
        return self.spans.get((), self.value_span)


@dataclass(frozen=True, slots=True)
class FrontMatter:
    """The `---` block at the very start of a file, entries in source order."""

    entries: tuple[FrontMatterEntry, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Text:
    """Fixed text after whitespace control (never empty). `raw` is True for the contents of a
    `{% raw %}` block, which are never interpreted."""

    text: str
    span: Span
    raw: bool = False


@dataclass(frozen=True, slots=True)
class Interp:
    """`{{ expr }}`: the value of `expr` inserted as fixed text."""

    expr: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class HoleArg:
    """One `key=expr` argument of a hole, as written (unknown keys are the compiler's job)."""

    name: str
    expr: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Gen:
    """`{{ gen NAME key=value ... }}`; `span` is the whole tag, `name_span` the capture name."""

    name: str
    args: tuple[HoleArg, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True, slots=True)
class Select:
    """`{{ select NAME key=value ... }}`; same shape as Gen."""

    name: str
    args: tuple[HoleArg, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True, slots=True)
class IfArm:
    """One `{% if test %}` or `{% elif test %}` arm and its body; `span` is the tag."""

    test: Expr
    body: tuple[Node, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class If:
    """`if/elif/else/endif`: at least one arm; `orelse` is None without `{% else %}`.
    `span` is the opening `{% if %}` tag."""

    arms: tuple[IfArm, ...]
    orelse: tuple[Node, ...] | None
    span: Span
    else_span: Span | None = None


@dataclass(frozen=True, slots=True)
class For:
    """`{% for target in iterable %} body {% endfor %}`; `span` is the opening tag. Several
    `targets` (`for k, v in d.items()`) unpack each item; `target_spans` are theirs."""

    targets: tuple[str, ...]
    iterable: Expr
    body: tuple[Node, ...]
    span: Span
    target_spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class Break:
    """`{% break %}`: leave the innermost loop."""

    span: Span


@dataclass(frozen=True, slots=True)
class Continue:
    """`{% continue %}`: go on with the innermost loop's next item."""

    span: Span


@dataclass(frozen=True, slots=True)
class Include:
    """`{% include "file.tmpl" %}`: `template` as written (the compiler requires a string
    literal and loads the file, lang/include.py)."""

    template: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Set:
    """`{% set name = expr %}`."""

    name: str
    expr: Expr
    span: Span
    name_span: Span


@dataclass(frozen=True, slots=True)
class Role:
    """`{% system %}`, `{% user %}` or `{% assistant %}` ... matching end tag; `span` is the
    opening tag; `args` its arguments (`{% system tools=TOOLS %}`), as written."""

    role: str
    body: tuple[Node, ...]
    span: Span
    args: tuple[HoleArg, ...] = ()


@dataclass(frozen=True, slots=True)
class While:
    """`{% while test %} body {% endwhile %}`; `span` is the opening tag."""

    test: Expr
    body: tuple[Node, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Fork:
    """`{% fork target in iterable %} body {% endfork %}`: the body runs once per item, each
    run a branch from the context before the block (docs/language.md §23); shaped as For."""

    targets: tuple[str, ...]
    iterable: Expr
    body: tuple[Node, ...]
    span: Span
    target_spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class Particles:
    """`{% particles count %} body {% endparticles %}`: the body runs as `count` weighted
    particles from the context before the block, and one of them goes on (docs/language.md
    §23.5)."""

    count: Expr
    body: tuple[Node, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Hidden:
    """`{% hidden %} body {% endhidden %}`: the body runs in the context, which is then taken
    back to where the block began."""

    body: tuple[Node, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Try:
    """`{% try %} body {% except err %} handler {% endtry %}`: `name` (None for a bare
    `{% except %}`) is bound to the error's message in the handler; `handler` is None when the
    block has no `{% except %}` (a compile error)."""

    body: tuple[Node, ...]
    name: str | None
    handler: tuple[Node, ...] | None
    span: Span
    except_span: Span | None = None


@dataclass(frozen=True, slots=True)
class MacroParam:
    """One parameter of a macro, with its default value when it has one."""

    name: str
    default: Expr | None
    span: Span


@dataclass(frozen=True, slots=True)
class Macro:
    """`{% macro name(a, b="x") %} body {% endmacro %}`; `span` is the opening tag."""

    name: str
    params: tuple[MacroParam, ...]
    body: tuple[Node, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True, slots=True)
class Return:
    """`{% return expr %}`: end the macro being run with the value of `expr`."""

    expr: Expr
    span: Span




@dataclass(frozen=True, slots=True)
class Fresh:
    """`{% fresh %} body {% endfresh %}`: the body runs in a new, empty context."""

    body: tuple[Node, ...]
    span: Span


Node = (Text | Interp | Gen | Select | If | For | Set | Role | Break | Continue | Include
        | While | Try | Macro | Return | Fork | Particles | Hidden | Fresh)


@dataclass(frozen=True, slots=True)
class Template:
    """A whole template: optional front matter and the body; `span` covers the source."""

    front_matter: FrontMatter | None
    body: tuple[Node, ...]
    span: Span


def children(node: Node) -> Iterator[Node]:
    """The nodes nested directly in `node` (if-arm bodies in order, then the else body)."""
    match node:
        case If(arms=arms, orelse=orelse):
            for arm in arms:
                yield from arm.body
            yield from orelse or ()
        case (For(body=body) | Role(body=body) | While(body=body) | Macro(body=body)
              | Fork(body=body) | Particles(body=body) | Hidden(body=body) | Fresh(body=body)):
            yield from body
        case Try(body=body, handler=handler):
            yield from body
            yield from handler or ()
        case (Text() | Interp() | Gen() | Select() | Set() | Break() | Continue() | Include()
              | Return()):
            pass


def walk(nodes: Iterable[Node]) -> Iterator[Node]:
    """Every node in `nodes` and below, depth first, in source order."""
    for node in nodes:
        yield node
        yield from walk(children(node))
