"""Host functions for examples/calculator.tmpl: `qrun examples/calculator.tmpl --functions
examples/calculator.py -v question="..."`. The template calls calc(expression) with what the
model wrote; calc reads it with Python's ast and computes numbers, + - * / ** and parentheses
only, never evaluating code."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

import qrun

_OPERATORS: dict[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow,
}
MAX_EXPONENT = 100  # 9 ** 9 ** 9 would take forever
MAX_LENGTH = 200

functions = qrun.Functions()


@functions.register
def calc(expression: str) -> float | int:
    """Compute an arithmetic expression: numbers, + - * / **, parentheses."""
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"expression longer than {MAX_LENGTH} characters")
    tree = ast.parse(expression.strip(), mode="eval")
    return _value(tree.body)


def _value(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent larger than {MAX_EXPONENT}")
        result = _OPERATORS[type(node.op)](left, right)
        if isinstance(result, complex):
            raise ValueError("the result is not a real number")
        return result  # type: ignore[no-any-return]
    raise ValueError(f"not arithmetic: {ast.unparse(node)}")
