"""Deterministic text dumps of the IR (Program.dump()) and of expressions, in the style of
SGLang's print_graph: one op per line with its source position, nested blocks indented. Used by
golden tests and `qrun --check --dump`-style debugging."""

from __future__ import annotations

import json
from typing import Any

from qrun.lang import expr as ex
from qrun.lang import ir

_INDENT = "  "


def dump_program(program: ir.Program) -> str:
    """Header lines (inputs, captures, defaults), then the ops."""
    declared = " (declared)" if program.inputs_declared else ""
    lines = [
        f"inputs: {', '.join(program.inputs) or '-'}{declared}",
        f"captures: {', '.join(program.captures) or '-'}",
    ]
    defaults = _defaults(program.defaults)
    if defaults:
        lines.append(f"defaults: {defaults}")
    lines.extend(_ops(program.ops, 0))
    return "\n".join(lines) + "\n"


def _defaults(defaults: ir.RunDefaults) -> str:
    fields = ("model", "temperature", "top_p", "seed", "max_tokens", "device", "dtype")
    parts = []
    for name in fields:
        value = getattr(defaults, name)
        if value is not None:
            parts.append(f"{name}={_literal(value)}")
    return " ".join(parts)


def _ops(ops: tuple[ir.Op, ...], depth: int) -> list[str]:
    lines: list[str] = []
    for op in ops:
        lines.extend(_op(op, depth))
    return lines


def _line(depth: int, text: str, span: Any) -> str:
    return f"{_INDENT * depth}{text}  @{span.line}:{span.column}"


def _op(op: ir.Op, depth: int) -> list[str]:
    match op:
        case ir.EmitText(text=text, span=span):
            return [_line(depth, f"text {_literal(text)}", span)]
        case ir.EmitValue(expr=value, span=span):
            return [_line(depth, f"value {format_expr(value)}", span)]
        case ir.Gen():
            return [_line(depth, _gen(op), op.span)]
        case ir.Select():
            return [_line(depth, _select(op), op.span)]
        case ir.If():
            return _if(op, depth)
        case ir.For(target=target, iterable=iterable, body=body, span=span):
            return [_line(depth, f"for {target} in {format_expr(iterable)}", span),
                    *_ops(body, depth + 1)]
        case ir.Set(name=name, expr=value, span=span):
            return [_line(depth, f"set {name} = {format_expr(value)}", span)]
        case ir.Role(role=role, body=body, span=span):
            return [_line(depth, f"role {role}", span), *_ops(body, depth + 1)]
    raise TypeError(f"unknown op {type(op).__name__}")


def _if(op: ir.If, depth: int) -> list[str]:
    lines: list[str] = []
    for number, branch in enumerate(op.branches):
        word = "if" if number == 0 else "elif"
        lines.append(_line(depth, f"{word} {format_expr(branch.condition)}", branch.span))
        lines.extend(_ops(branch.body, depth + 1))
    if op.orelse:
        lines.append(f"{_INDENT * depth}else")
        lines.extend(_ops(op.orelse, depth + 1))
    return lines


def _hole_name(name: str, in_loop: bool) -> str:
    return f"{name}[]" if in_loop else name


def _gen(op: ir.Gen) -> str:
    params = op.params
    parts = [f"gen {_hole_name(op.name, op.in_loop)}"]
    for key in ("max_tokens", "stop"):
        value = getattr(params, key)
        if value is not None:
            parts.append(f"{key}={format_expr(value)}")
    match params.constraint:
        case ir.Regex(pattern=pattern, stdlib_name=str(name)):
            parts.append(f"regex={name}")
        case ir.Regex(pattern=pattern):
            parts.append(f"regex={format_expr(pattern)}")
        case ir.JsonSchema(schema=schema):
            parts.append(f"json={format_expr(schema)}")
    for key in ("temperature", "top_p", "top_k", "seed", "heal"):
        value = getattr(params, key)
        if value is not None:
            parts.append(f"{key}={format_expr(value)}")
    return " ".join(parts)


def _select(op: ir.Select) -> str:
    parts = [f"select {_hole_name(op.name, op.in_loop)} options={format_expr(op.options)}"]
    if op.temperature is not None:
        parts.append(f"temperature={format_expr(op.temperature)}")
    if op.normalize is not None:
        parts.append(f"normalize={format_expr(op.normalize)}")
    return " ".join(parts)


def format_expr(node: ex.Expr) -> str:
    """Source-like text of an expression; operators are fully parenthesised, so the text shows
    exactly how the expression was parsed: `a + b * c` -> `(a + (b * c))`."""
    match node:
        case ex.Const(value=value):
            return _literal(value)
        case ex.Name(name=name):
            return name
        case ex.Attr(obj=obj, attr=attr):
            return f"{format_expr(obj)}.{attr}"
        case ex.Index(obj=obj, index=index):
            return f"{format_expr(obj)}[{format_expr(index)}]"
        case ex.Slice(obj=obj, lower=lower, upper=upper, step=step):
            parts = [format_expr(p) if p is not None else "" for p in (lower, upper, step)]
            inner = ":".join(parts if step is not None else parts[:2])
            return f"{format_expr(obj)}[{inner}]"
        case ex.ListExpr(items=items):
            return "[" + ", ".join(format_expr(i) for i in items) + "]"
        case ex.DictExpr(items=pairs):
            return "{" + ", ".join(f"{format_expr(k)}: {format_expr(v)}" for k, v in pairs) + "}"
        case ex.Unary(op=op, operand=operand):
            space = " " if op == "not" else ""
            return f"({op}{space}{format_expr(operand)})"
        case ex.Binary(op=op, left=left, right=right):
            return f"({format_expr(left)} {op} {format_expr(right)})"
        case ex.Compare(left=left, ops=ops, rights=rights):
            tail = "".join(f" {op} {format_expr(r)}" for op, r in zip(ops, rights, strict=True))
            return f"({format_expr(left)}{tail})"
        case ex.BoolOp(op=op, values=values):
            return "(" + f" {op} ".join(format_expr(v) for v in values) + ")"
        case ex.Cond(body=body, test=test, orelse=orelse):
            return f"({format_expr(body)} if {format_expr(test)} else {format_expr(orelse)})"
        case ex.Call(func=func, args=args, kwargs=kwargs):
            return f"{func}({_args(args, kwargs)})"
        case ex.Filter(value=value, name=name, args=args, kwargs=kwargs):
            call = f"({_args(args, kwargs)})" if args or kwargs else ""
            return f"({format_expr(value)} | {name}{call})"
    raise TypeError(f"unknown expression {type(node).__name__}")


def _args(args: tuple[ex.Expr, ...], kwargs: tuple[tuple[str, ex.Expr], ...]) -> str:
    parts = [format_expr(a) for a in args]
    parts.extend(f"{name}={format_expr(value)}" for name, value in kwargs)
    return ", ".join(parts)


def _literal(value: Any) -> str:
    """Strings in double quotes with JSON escapes (`"\\n"`); other constants as in Python."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)
