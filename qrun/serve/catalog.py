"""The templates a server serves, by name (docs/serve.md §2.1): `.tmpl` files given on the
command line (folders: every `.tmpl` inside), each compiled once at start-up; a request names
one of them and nothing else, so no path is ever read from a request."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qrun.api import HostFunctions, Query
from qrun.errors import UsageError
from qrun.lang import ir
from qrun.lang.expr import Const, DictExpr, ListExpr
from qrun.lang.size import missing_or_odd

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A served template's name: its file name without `.tmpl` (what a URL carries as it is)."""


def load_templates(paths: Iterable[str | os.PathLike[str]],
                   functions: HostFunctions | None = None) -> dict[str, Query]:
    """Every template of `paths` (files, or folders searched for `*.tmpl`), compiled, by name.

    Raises:
        UsageError: a path is missing, holds no template, or two templates share a name.
        TemplateErrors: a template does not compile.
    """
    found: dict[str, Path] = {}
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files = sorted(path.rglob("*.tmpl"))
            if not files:
                raise UsageError(f"{path}: no .tmpl file in this folder")
        elif path.is_file():
            files = [path]
        else:
            raise UsageError(f"{path}: {missing_or_odd(path)}")
        for file in files:
            name = file.name.removesuffix(".tmpl")
            if not NAME.fullmatch(name):
                raise UsageError(f"{file}: a served template's name (its file name without "
                                 ".tmpl) is letters, digits, '_', '.' and '-'")
            if name in found and found[name].resolve() != file.resolve():
                raise UsageError(f"{file} and {found[name]} would both be served as {name!r}: "
                                 "rename one")
            # As given, not resolved: error positions name the file so, not the server's
            # absolute path.
            found[name] = file
    return {name: Query.from_file(file, functions=functions) for name, file in found.items()}


def describe(name: str, query: Query) -> dict[str, Any]:
    """What GET /v1/templates tells of a template: its inputs (with their JSON Schema: the
    declared types of a typed template, docs/language.md §4.1), its holes with their
    constraints (the literal ones; a constraint built at run time is only named), the JSON
    Schema of its typed result record (`output`, or null), and its front matter's run
    options."""
    program = query.program
    options = {k: v for k, v in vars_of(program.options).items() if v is not None}
    return {"name": name, "inputs": list(program.inputs),
            "optional_inputs": list(program.optional_inputs),
            "input_schema": query.input_schema, "output_schema": query.output_schema,
            "holes": [_hole(op) for op, _ in ir.holes(program.ops, program.source,
                                                        macros=True)],
            "options": options}


def vars_of(options: Any) -> dict[str, Any]:
    """A run options dataclass as plain data (its limits left out: not a request's choice)."""
    return {name: getattr(options, name) for name in options.names() if name != "limits"}


def _hole(op: ir.Gen | ir.Select) -> dict[str, Any]:
    if isinstance(op, ir.Select):
        return {"name": op.name, "kind": "select", "in_loop": op.in_loop,
                "options": _literal(op.options)}
    constraint: dict[str, Any] | None = None
    match op.params.constraint:
        case ir.Regex(pattern=pattern, stdlib_name=named):
            constraint = {"kind": "regex", "pattern": _literal(pattern)}
            if named is not None:
                constraint["named"] = named
        case ir.JsonSchema(schema=schema):
            constraint = {"kind": "json", "schema": _literal(schema)}
        case ir.Grammar(grammar=grammar):
            constraint = {"kind": "grammar", "grammar": _literal(grammar)}
        case ir.ToolCall(tools=tools):
            constraint = {"kind": "tools", "tools": _literal(tools)}
        case None:
            pass
    return {"name": op.name, "kind": "gen", "in_loop": op.in_loop, "constraint": constraint,
            "max_tokens": _literal(op.params.max_tokens)}


def _literal(expr: Any) -> Any:
    """A literal argument's value (a list or dict of literals included); None for one
    computed at run time."""
    match expr:
        case Const(value=value):
            return value
        case ListExpr(items=items):
            return [_literal(item) for item in items]
        case DictExpr(items=pairs):
            return {key.value: _literal(value) for key, value in pairs
                    if isinstance(key, Const) and isinstance(key.value, str)}
    return None


def served(templates: Mapping[str, Query] | Iterable[str | os.PathLike[str]],
           functions: HostFunctions | None = None) -> dict[str, Query]:
    """`qrun.serve.app`'s templates as a name -> Query mapping: given so, or loaded from
    paths."""
    if isinstance(templates, Mapping):
        for name in templates:
            if not NAME.fullmatch(name):
                raise UsageError(f"{name!r}: a served template's name is letters, digits, '_', "
                                 "'.' and '-'")
        return dict(templates)
    return load_templates(templates, functions)
