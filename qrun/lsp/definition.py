"""Go to definition: an `{% include "f.tmpl" %}` tag or a `call("f.tmpl", ...)` goes to the
file, resolved as the compiler resolves it (lang/include.py: relative to the document's folder,
never outside it, never an absolute path; a name the compiler would refuse goes nowhere); a
capture used in an expression goes to its first binding (the name in the first hole that
captures it); an input goes to its declaration in the front matter."""

from __future__ import annotations

import os
from dataclasses import dataclass

from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.lsp.analysis import Analysis, Range, all_exprs, analyze, contains, folder_of, holes

CALL = "call"


@dataclass(frozen=True, slots=True)
class Location:
    """A place to go: a file and a range in it."""

    path: str
    range: Range


def definition(text: str, path: str, line: int, character: int) -> Location | None:
    """Where the thing at 0-based (line, character) of `text` is defined."""
    return definition_at(analyze(text, path), line, character)


def definition_at(analysis: Analysis, line: int, character: int) -> Location | None:
    template = analysis.template
    if template is None:
        return None
    offset = analysis.offset(line, character)
    path = analysis.source.name
    for node in ast.walk(template.body):
        if isinstance(node, ast.Include) and contains(node.span, offset):
            return _file(path, node.template)
    name: ex.Name | None = None
    for expr in all_exprs(template):
        if (isinstance(expr, ex.Call) and expr.func == CALL and expr.args
                and contains(expr.args[0].span, offset)):
            return _file(path, expr.args[0])
        if isinstance(expr, ex.Name) and contains(expr.span, offset):
            name = expr
    if name is None:
        return None
    for site in holes(template):
        if site.node.name == name.name:
            return Location(path, Range.of(site.node.name_span))
    program = analysis.program
    if program is not None and name.name in program.declared_at:
        return Location(path, Range.of(program.declared_at[name.name]))
    return None


def resolve_include(path: str, name: str) -> str | None:
    """The file `name` names when the template at `path` includes or calls it, or None
    where the compiler refuses the name (lang/include.py Includes.load) or no such file is."""
    if not name or "\0" in name or os.path.isabs(name):
        return None
    folder = folder_of(path)
    target = os.path.normpath(os.path.join(folder, name))
    real, root = os.path.realpath(target), os.path.realpath(folder)
    if os.path.commonpath([root, real]) != root or not os.path.isfile(real):
        return None
    return target


def _file(path: str, written: ex.Expr) -> Location | None:
    if not isinstance(written, ex.Const) or not isinstance(written.value, str):
        return None
    target = resolve_include(path, written.value)
    return Location(target, Range(0, 0, 0, 0)) if target is not None else None
