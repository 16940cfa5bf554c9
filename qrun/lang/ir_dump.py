"""A compiled program (lang/ir.py) as text, `dump_program`: one op per line with its source
position, nested blocks indented, in the style of SGLang's print_graph; deterministic (golden
tests pin it, `qrun FILE --dump` prints it)."""

from __future__ import annotations

import json
from typing import Any, assert_never

from qrun.lang import expr as ex
from qrun.lang.ir import (
    SAMPLING_FIELDS,
    Break,
    Continue,
    EmitText,
    EmitValue,
    For,
    Fork,
    Fresh,
    Gen,
    Grammar,
    Hidden,
    If,
    Include,
    JsonSchema,
    Macro,
    Op,
    Particles,
    Program,
    Regex,
    Return,
    Role,
    Select,
    Set,
    ToolCall,
    Try,
    While,
)

_INDENT = "  "


def dump_program(program: Program) -> str:
    """Header lines (inputs, captures, defaults), then the ops."""
    declared = " (declared)" if program.inputs_declared else ""
    lines = [f"inputs: {', '.join(program.inputs) or '-'}{declared}"]
    if program.optional_inputs:
        lines.append(f"optional: {', '.join(program.optional_inputs)}")
    lines.append(f"captures: {', '.join(program.captures) or '-'}")
    for name, schema in program.input_types.items():  # docs/language.md §4.1, §4.2
        lines.append(f"type {name}: {json.dumps(schema, ensure_ascii=False)}")
    if program.output_schema is not None:
        lines.append(f"output: {json.dumps(program.output_schema, ensure_ascii=False)}")
    defaults = _defaults(program)
    if defaults:
        lines.append(f"defaults: {defaults}")
    lines.extend(_ops(program.ops, 0))
    return "\n".join(lines) + "\n"


def _defaults(program: Program) -> str:
    """The front matter's model and run options, model first."""
    model, options = program.model, program.options
    values = [("model", model.model),
              *((name, getattr(options, name)) for name in options.names()),
              ("device", model.device), ("dtype", model.dtype)]
    return " ".join(f"{name}={ex.literal_text(value)}" for name, value in values
                    if value is not None)


def _ops(ops: tuple[Op, ...], depth: int) -> list[str]:
    lines: list[str] = []
    for op in ops:
        lines.extend(_op(op, depth))
    return lines


def _line(depth: int, text: str, span: Any) -> str:
    return f"{_INDENT * depth}{text}  @{span.line}:{span.column}"


def _op(op: Op, depth: int) -> list[str]:
    match op:
        case EmitText(text=text, span=span):
            return [_line(depth, f"text {ex.literal_text(text)}", span)]
        case EmitValue(expr=value, span=span):
            return [_line(depth, f"value {ex.format_expr(value)}", span)]
        case Gen():
            return [_line(depth, _gen(op), op.span)]
        case Select():
            return [_line(depth, _select(op), op.span)]
        case If():
            return _if(op, depth)
        case For(targets=targets, iterable=iterable, body=body, span=span):
            return [_line(depth, f"for {', '.join(targets)} in {ex.format_expr(iterable)}",
                          span), *_ops(body, depth + 1)]
        case Break(span=span):
            return [_line(depth, "break", span)]
        case Continue(span=span):
            return [_line(depth, "continue", span)]
        case Include(name=name, body=body, span=span):
            # The body's positions are in the included file (named as written).
            return [_line(depth, f"include {ex.literal_text(name)}", span),
                    *_ops(body, depth + 1)]
        case Fork(targets=targets, iterable=iterable, body=body, span=span, samples=samples):
            head = (f"fork n={ex.format_expr(iterable)}" if samples else
                    f"fork {', '.join(targets)} in {ex.format_expr(iterable)}")
            return [_line(depth, head, span), *_ops(body, depth + 1)]
        case Particles(count=count, body=body, span=span):
            return [_line(depth, f"particles {ex.format_expr(count)}", span),
                    *_ops(body, depth + 1)]
        case Hidden(body=body, span=span):
            return [_line(depth, "hidden", span), *_ops(body, depth + 1)]
        case Fresh(body=body, span=span):
            return [_line(depth, "fresh", span), *_ops(body, depth + 1)]
        case Set(name=name, expr=value, span=span):
            return [_line(depth, f"set {name} = {ex.format_expr(value)}", span)]
        case Role(role=role, body=body, span=span, tools=tools):
            head = f"role {role}" + (f" tools={ex.format_expr(tools)}" if tools is not None else "")
            return [_line(depth, head, span), *_ops(body, depth + 1)]
        case While(test=test, body=body, span=span):
            return [_line(depth, f"while {ex.format_expr(test)}", span), *_ops(body, depth + 1)]
        case Try(body=body, name=name, handler=handler, span=span):
            bound = f" {name}" if name is not None else ""
            return [_line(depth, "try", span), *_ops(body, depth + 1),
                    f"{_INDENT * depth}except{bound}", *_ops(handler, depth + 1)]
        case Macro(name=name, params=params, body=body, span=span):
            listed = ", ".join(p.name if p.default is None
                               else f"{p.name}={ex.format_expr(p.default)}" for p in params)
            return [_line(depth, f"macro {name}({listed})", span), *_ops(body, depth + 1)]
        case Return(expr=value, span=span):
            return [_line(depth, f"return {ex.format_expr(value)}", span)]
        case _:
            assert_never(op)


def _if(op: If, depth: int) -> list[str]:
    lines: list[str] = []
    for number, branch in enumerate(op.branches):
        word = "if" if number == 0 else "elif"
        lines.append(_line(depth, f"{word} {ex.format_expr(branch.condition)}", branch.span))
        lines.extend(_ops(branch.body, depth + 1))
    if op.orelse:
        lines.append(f"{_INDENT * depth}else")
        lines.extend(_ops(op.orelse, depth + 1))
    return lines


def _hole_name(name: str, in_loop: bool) -> str:
    return f"{name}[]" if in_loop else name


def _gen(op: Gen) -> str:
    params = op.params
    parts = [f"gen {_hole_name(op.name, op.in_loop)}"]
    for key in ("max_tokens", "stop"):
        value = getattr(params, key)
        if value is not None:
            parts.append(f"{key}={ex.format_expr(value)}")
    match params.constraint:
        case Regex(pattern=pattern, stdlib_name=str(name)):
            parts.append(f"regex={name}")
        case Regex(pattern=pattern):
            parts.append(f"regex={ex.format_expr(pattern)}")
        case (JsonSchema(schema=schema, closed=closed, formats=formats)
              | ToolCall(tools=schema, closed=closed, formats=formats)):
            key = "json" if isinstance(params.constraint, JsonSchema) else "tools"
            parts.append(f"{key}={ex.format_expr(schema)}")
            if closed is not None:
                parts.append(f"closed={ex.format_expr(closed)}")
            if formats is not None:
                parts.append(f"formats={ex.format_expr(formats)}")
        case Grammar(grammar=grammar):
            parts.append(f"grammar={ex.format_expr(grammar)}")
    if params.constraint is not None:
        parts.append(f"[{params.constraint.engine}]")
    if isinstance(params.constraint, ToolCall):
        parts.append("-> {name, arguments}")
    for key in SAMPLING_FIELDS:
        value = getattr(params, key)
        if value is not None:
            parts.append(f"{key}={ex.format_expr(value)}")
    return " ".join(parts)


def _select(op: Select) -> str:
    parts = [f"select {_hole_name(op.name, op.in_loop)} options={ex.format_expr(op.options)}"]
    if op.temperature is not None:
        parts.append(f"temperature={ex.format_expr(op.temperature)}")
    if op.normalize is not None:
        parts.append(f"normalize={ex.format_expr(op.normalize)}")
    return " ".join(parts)
