"""Document symbols: the outline of a template, its inputs (where declared, else where first
used) and its holes (the whole tag, the name selected), in source order."""

from __future__ import annotations

from dataclasses import dataclass

from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.lsp.analysis import Analysis, Range, all_exprs, analyze, holes
from qrun.source import Span

INPUT, HOLE = "input", "hole"


@dataclass(frozen=True, slots=True)
class Symbol:
    """One entry of the outline: name, kind (INPUT or HOLE), a detail line, the range it
    covers and the range of its name."""

    name: str
    kind: str
    detail: str
    range: Range
    selection: Range


def symbols(text: str, path: str) -> list[Symbol]:
    """The outline of the document `text` at `path`."""
    return symbols_of(analyze(text, path))


def symbols_of(analysis: Analysis) -> list[Symbol]:
    found: list[Symbol] = []
    program = analysis.program
    if program is not None:
        # Where an input is first used may be in an included file: only this document's
        # own names are placed.
        first: dict[str, Span] = {}
        if analysis.template is not None:
            for expr in all_exprs(analysis.template):
                if isinstance(expr, ex.Name):
                    first.setdefault(expr.name, expr.span)
        for name in (*program.inputs, *program.optional_inputs):
            span = program.declared_at.get(name) or first.get(name)
            if span is not None:
                detail = "input" if name in program.inputs else "input (optional)"
                found.append(Symbol(name, INPUT, detail, Range.of(span), Range.of(span)))
    if analysis.template is not None:
        for site in holes(analysis.template):
            node = site.node
            kind = "select" if isinstance(node, ast.Select) else "gen"
            detail = f"{kind} hole" + (" (in a loop: a list)" if site.in_loop else "")
            found.append(Symbol(node.name, HOLE, detail, Range.of(node.span),
                                Range.of(node.name_span)))
    found.sort(key=lambda s: (s.range.line, s.range.character))
    return found
