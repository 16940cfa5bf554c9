"""Hover: what the compiled template knows about the thing under the cursor, as Markdown.
A hole (its kind, the type of its capture, its constraint and its other arguments as
written), a capture used in an expression (the same, from its first binding), an input (how a
run gives it, its declared type, default and description from the typed front matter when it
has them, docs/language.md §4.1, and where the template uses it), a named pattern in
`regex=NAME` (its regex, qrun/constraint/patterns.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qrun.constraint import PATTERNS
from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.lang.args import CONSTRAINT_ARGS, pattern_name
from qrun.lsp.analysis import (
    Analysis,
    HoleSite,
    Range,
    all_exprs,
    analyze,
    contains,
    holes,
    input_names,
)
from qrun.source import Span

MAX_SHOWN = 1_000
"""Characters of an argument's text a hover shows at most (a schema can be long)."""
MAX_USES = 10
"""Uses of an input a hover lists at most."""


@dataclass(frozen=True, slots=True)
class Hover:
    """Markdown about the range the cursor is in."""

    range: Range
    markdown: str


def hover(text: str, path: str, line: int, character: int) -> Hover | None:
    """The hover at 0-based (line, character) of the document `text` at `path`."""
    return hover_at(analyze(text, path), line, character)


def hover_at(analysis: Analysis, line: int, character: int) -> Hover | None:
    template = analysis.template
    if template is None:  # does not parse: nothing is known of its parts
        return None
    offset = analysis.offset(line, character)
    sites = list(holes(template))
    for site in sites:
        for arg in site.node.args:
            name = pattern_name(arg)
            if name is not None and contains(arg.expr.span, offset):
                return Hover(Range.of(arg.expr.span), _pattern(name))
    inputs = input_names(analysis)
    name_node = _innermost_name(template, offset)
    if name_node is not None:
        first = next((s for s in sites if s.node.name == name_node.name), None)
        if first is not None:
            return Hover(Range.of(name_node.span), _hole(analysis, first))
        if name_node.name in inputs:
            return Hover(Range.of(name_node.span), _input(analysis, name_node.name))
    for site in sites:
        if contains(site.node.span, offset):
            return Hover(Range.of(site.node.span), _hole(analysis, site))
    declared = analysis.program.declared_at if analysis.program is not None else {}
    for name, span in declared.items():
        if contains(span, offset):
            return Hover(Range.of(span), _input(analysis, name))
    return None


def _innermost_name(template: ast.Template, offset: int) -> ex.Name | None:
    found = None
    for node in all_exprs(template):
        if isinstance(node, ex.Name) and contains(node.span, offset):
            found = node
    return found


def _pattern(name: str) -> str:
    regex = PATTERNS.get(name)
    if regex is None:
        return f"**pattern** `{name}`: not a named pattern (known: {', '.join(PATTERNS)})"
    return f"**pattern** `{name}`, matched in full:\n\n```regex\n{regex}\n```"


def _written(analysis: Analysis, span: Span) -> str:
    text = analysis.source.text[span.start:span.end]
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


def _hole(analysis: Analysis, site: HoleSite) -> str:
    node = site.node
    args = {arg.name: arg for arg in node.args}
    count = args.get("n")
    if isinstance(node, ast.Select):
        kind, value = "select", "str, one of the options"
    elif "json" in args:
        kind, value = "gen", "a JSON value valid against the schema"
    elif "tools" in args:
        kind, value = "gen", "a tool call: dict {name, arguments}"
    else:
        kind, value = "gen", "str"
    if count is not None:
        value = f"list of n={_written(analysis, count.expr.span)} of ({value})"
    if site.in_loop:
        value = f"list (one per loop iteration) of ({value})"
    lines = [f"**{kind}** `{node.name}` → {value}", ""]
    constraint = next((args[name] for name in CONSTRAINT_ARGS if name in args), None)
    if isinstance(node, ast.Select):
        options = args.get("options")
        if options is not None:
            lines.append(f"options: `{_written(analysis, options.expr.span)}`")
    elif constraint is None:
        lines.append("constraint: none (free text, up to a stop, EOS or max_tokens)")
    elif (name := pattern_name(constraint)) is not None:
        lines.append(f"constraint: pattern `{name}`")
        lines.append(f"```regex\n{PATTERNS.get(name, '?')}\n```")
    else:
        language = {"regex": "regex", "json": "json", "tools": "json"}.get(constraint.name, "")
        what = {"regex": "regex", "json": "JSON Schema", "grammar": "Lark grammar",
                "tools": "tools"}[constraint.name]
        lines.append(f"constraint: {what}")
        lines.append(f"```{language}\n{_written(analysis, constraint.expr.span)}\n```")
    others = [arg for arg in node.args if arg is not constraint and arg.name != "options"]
    if others:
        lines.append("")
        lines.extend(f"- `{arg.name}={_written(analysis, arg.expr.span)}`" for arg in others)
    output = analysis.program.output_schema if analysis.program is not None else None
    properties = output.get("properties", {}) if isinstance(output, dict) else {}
    if isinstance(properties, dict) and node.name in properties:
        lines.extend(["", "declared in `output:`", _schema(properties[node.name])])
    return "\n".join(lines)


def _schema(schema: Any) -> str:
    text = json.dumps(schema, indent=2, ensure_ascii=False)
    if len(text) > MAX_SHOWN:
        text = text[:MAX_SHOWN] + "…"
    return f"```json\n{text}\n```"


def _declared(analysis: Analysis, name: str) -> str | None:
    """An input's type as the front matter writes it (when the program is not compiled)."""
    front = analysis.template.front_matter if analysis.template is not None else None
    for entry in front.entries if front is not None else ():
        if entry.key == "inputs" and isinstance(entry.data, dict) and name in entry.data:
            data = entry.data[name]
            text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            return text[:MAX_SHOWN]
    return None


def _input(analysis: Analysis, name: str) -> str:
    program = analysis.program
    how = "input"
    if program is not None:
        if name in program.input_defaults:
            how = f"input, default `{json.dumps(program.input_defaults[name])}`"
        elif name in program.optional_inputs:
            how = "input, optional (absent: undefined)"
        else:
            how = "input, required"
    lines = [f"**{how}** `{name}`", ""]
    schema = program.input_types.get(name) if program is not None else None
    if schema is not None:
        description = schema.get("description") if isinstance(schema, dict) else None
        if isinstance(description, str):
            lines.extend([description, ""])
        lines.extend(["declared type:", _schema(schema)])
    elif (written := _declared(analysis, name)) is not None:  # the template has errors
        lines.append(f"declared type: `{written}`")
    else:
        lines.append("type: not declared (any value)")
    uses = [node.span for node in all_exprs(analysis.template)
            if isinstance(node, ex.Name) and node.name == name] if analysis.template else []
    if uses:
        shown = ", ".join(f"{span.line}:{span.column}" for span in uses[:MAX_USES])
        more = f" and {len(uses) - MAX_USES} more" if len(uses) > MAX_USES else ""
        lines.extend(["", f"used at {shown}{more}"])
    return "\n".join(lines)
