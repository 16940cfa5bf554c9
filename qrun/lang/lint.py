"""Part of stage 3 (compile_template): warnings, for a template that compiles but very likely
does not mean what it says (docs/language.md §13). They are found on the finished ops, once
every error check has passed, so each name means what the compiler resolved it to."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from qrun.errors import TemplateWarning
from qrun.lang import expr as ex
from qrun.lang import ir
from qrun.lang.args import MISSING, literal
from qrun.source import Source

_SCALAR = (str, int, float, bool, type(None))


def find_warnings(ops: tuple[ir.Op, ...], source: Source,
                  types: Mapping[str, Any] | None = None) -> tuple[TemplateWarning, ...]:
    """The warnings of a compiled template's ops, in source order (includes expanded);
    `types` are the typed inputs (lang/declared.py InputType by name), whose uses must fit."""
    lint = _Lint({name: t.schema for name, t in (types or {}).items()})
    lint.block(ops, source, frozenset(), ())
    return tuple(lint.warnings)


class _Lint:
    """One walk over the ops in source order, knowing which captures are a loop's lists."""

    def __init__(self, types: Mapping[str, Any]) -> None:
        self.types = types  # typed inputs' JSON Schemas
        self.warnings: list[TemplateWarning] = []
        self.lists: set[str] = set()  # captured by a hole inside a loop (docs/language.md §9)
        self.plain: set[str] = set()  # captured by a hole outside any loop

    def block(self, ops: Iterable[ir.Op], source: Source, local: frozenset[str],
              notes: tuple[str, ...]) -> None:
        """`local`: the loop variables in scope (they hide a capture's name)."""
        for op in ops:
            self.op(op, source, local, notes)

    def op(self, op: ir.Op, source: Source, local: frozenset[str],
           notes: tuple[str, ...]) -> None:
        match op:
            case ir.If(branches=branches, orelse=orelse):
                for branch in branches:  # a test is read before its body runs
                    self.expr(branch.condition, source, local, notes)
                    self.block(branch.body, source, local, notes)
                self.block(orelse, source, local, notes)
                return
            case ir.Include(body=body, source=inner):
                where = f"included from {source.name}:{op.span}"
                self.block(body, inner, local, (*notes, where))
                return
        for value in ir.exprs(op):
            self.expr(value, source, local, notes)
        match op:
            case ir.Gen() | ir.Select():
                (self.lists if op.in_loop else self.plain).add(op.name)
            case ir.Particles(body=body) if not _may_draw(body, source):
                self.warnings.append(TemplateWarning(
                    "this particles block has no hole: its particles are all the same, and "
                    "the block only repeats its body's work", op.span, source,
                    ("put the holes to be drawn together inside it (docs/language.md §23.5)",
                     *notes)))
                self.block(body, source, local, notes)
            case ir.For(targets=targets, body=body) | ir.Fork(targets=targets, body=body):
                if not (isinstance(op, ir.Fork) and op.samples):
                    self.loop_over(op.iterable, source, local, notes)
                self.block(body, source, local | {*targets, "loop"}, notes)
            case _:
                self.block(ir.children(op), source, local, notes)

    def expr(self, node: ex.Expr, source: Source, local: frozenset[str],
             notes: tuple[str, ...]) -> None:
        if isinstance(node, ex.Compare):
            self.compare(node, source, local, notes)
        if isinstance(node, ex.Attr):
            self.attribute(node, source, local, notes)
        for child in ex.children(node):
            self.expr(child, source, local, notes)

    def compare(self, node: ex.Compare, source: Source, local: frozenset[str],
                notes: tuple[str, ...]) -> None:
        """A loop's capture, the list of its values, compared with one literal value: `m ==
        "a"` is always false (`m[-1] == "a"` compares the latest value). `"a" in m` is a fair
        question and is left alone. One warning per comparison (chain)."""
        lefts = (node.left, *node.rights[:-1])
        for left, op, right in zip(lefts, node.ops, node.rights, strict=True):
            sides = [(left, right), (right, left)] if op in ("==", "!=") else [(left, right)]
            for side, other in sides:
                outcome = _outcome_with_list(op, literal(other))
                if outcome is not None and isinstance(side, ex.Name) and self.is_list(
                        side.name, local):
                    self.warn(source, side, op, other, outcome, notes)
                    return

    def declared(self, node: ex.Expr, local: frozenset[str]) -> tuple[str, Any] | None:
        """The text and JSON Schema of a typed input (`user`) or a property path in one
        (`user.address.city`), as declared; None for anything else."""
        if isinstance(node, ex.Name):
            if node.name in local or node.name not in self.types:
                return None
            return node.name, self.types[node.name]
        if isinstance(node, ex.Attr):
            outer = self.declared(node.obj, local)
            if outer is None or not isinstance(outer[1], dict):
                return None
            inner = outer[1].get("properties", {}).get(node.attr)
            return None if inner is None else (f"{outer[0]}.{node.attr}", inner)
        return None

    def loop_over(self, iterable: ex.Expr, source: Source, local: frozenset[str],
                  notes: tuple[str, ...]) -> None:
        """A loop over a typed input declared as a string (its characters) or a number,
        boolean or null (an error when it runs)."""
        found = self.declared(iterable, local)
        kind = _kind(found[1]) if found else None
        if found is None or kind not in ("string", "number", "integer", "boolean", "null"):
            return
        outcome = ("goes over its characters one by one" if kind == "string"
                   else "fails when it runs (only a list, a mapping or a string can be looped "
                        "over)")
        self.warnings.append(TemplateWarning(
            f"'{found[0]}' is declared as {kind}, so a loop over it {outcome}",
            iterable.span, source,
            ("declare it as list[...] in the front matter's inputs, or loop over a list",
             *notes)))

    def attribute(self, node: ex.Attr, source: Source, local: frozenset[str],
                  notes: tuple[str, ...]) -> None:
        """`x.attr` on a typed input (or a property path in one) that cannot have `attr`:
        not an object, or an object whose properties are all listed and `attr` is not."""
        found = self.declared(node.obj, local)
        if found is None or not isinstance(found[1], dict):
            return
        name, schema = found
        kind = _kind(schema)
        properties = schema.get("properties")
        if kind not in (None, "object"):
            reason = f"is declared as {kind}, which has no attribute '{node.attr}'"
        elif isinstance(properties, dict) and node.attr not in properties and schema.get(
                "additionalProperties", True) is False:
            listed = ", ".join(properties) or "none"
            reason = f"is declared with properties {listed} only: '{node.attr}' is never there"
        else:
            return
        self.warnings.append(TemplateWarning(
            f"'{name}' {reason}", node.span, source,
            ("the front matter's inputs declare its type (docs/language.md §4.1)", *notes)))

    def is_list(self, name: str, local: frozenset[str]) -> bool:
        """Whether `name` is a loop's capture on every path (a capture of the name outside any
        loop, in another branch, may make it one value)."""
        return name not in local and name in self.lists and name not in self.plain

    def warn(self, source: Source, side: ex.Name, op: str, other: ex.Expr, outcome: str,
             notes: tuple[str, ...]) -> None:
        text, name = source.text, side.name
        start = min(side.span.start, other.span.start)
        end = max(side.span.end, other.span.end)
        fixed = text[start:side.span.start] + f"{name}[-1]" + text[side.span.end:end]
        fixes = [f"compare the latest value: `{fixed}`"]
        value = text[other.span.start:other.span.end]
        if op == "==":
            fixes.append(f"`{value} in {name}` asks whether any value is {value}")
        elif op == "!=":
            fixes.append(f"`{value} not in {name}` asks whether no value is {value}")
        self.warnings.append(TemplateWarning(
            f"'{name}' is a list here (a hole inside a loop captures one value per "
            f"iteration), so `{text[start:end]}` {outcome}",
            source.span_at(start, end - start), source, (*fixes, *notes)))


def _kind(schema: Any) -> str | None:
    """The one JSON type a schema allows, or None."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return kind if isinstance(kind, str) else None


def _outcome_with_list(op: str, value: object) -> str | None:
    """What comparing a list with the literal `value` by `op` always gives, as a phrase; None
    when it can go either way (or `value` is not a literal)."""
    if value is MISSING:
        return None
    if op in ("==", "!="):
        if not isinstance(value, _SCALAR):
            return None
        return "is always false" if op == "==" else "is always true"
    if op not in ("in", "not in"):
        return None
    if isinstance(value, str):
        return "fails when it runs (a list is never in a string)"
    if isinstance(value, list) and all(isinstance(item, _SCALAR) for item in value):
        return "is always false" if op == "in" else "is always true"
    return None


def _may_draw(ops: tuple[ir.Op, ...], source: Source) -> bool:
    """Whether a block's body has a hole, or a call (a macro's holes run where it is called;
    a call of any kind counts, so that the warning is never wrong)."""
    if any(True for _ in ir.holes(ops, source, macros=True)):
        return True
    return any(isinstance(node, ex.Call) for op in ir.walk(ops) for value in ir.exprs(op)
               for node in ex.walk(value))
