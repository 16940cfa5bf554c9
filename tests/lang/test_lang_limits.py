"""qrun/limits.py and its use in lang/evaluate.py: every node, and work that grows with a value's
size, is charged to a per-run budget; every integer an operation computes is bounded; the
limits are a frozen dataclass a caller can raise. (End-to-end runs: tests/runtime/
test_safe_edges.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from qrun.errors import EvaluationError, UsageError
from qrun.lang import ast as ast_nodes
from qrun.lang import build_ast, parse
from qrun.lang.evaluate import evaluate, evaluate_text
from qrun.limits import CHARS_PER_STEP, EMIT_STEPS, ITEMS_PER_STEP, Budget, Limits
from qrun.source import Source


def parse_expr(text: str) -> tuple[Any, Source]:
    source = Source("e.tmpl", "{{ " + text + " }}")
    node = build_ast(parse(source), source).body[0]
    assert isinstance(node, ast_nodes.Interp)
    return node.expr, source


DEFAULT = Limits()


def run(text: str, limits: Limits = DEFAULT, **scope: Any) -> tuple[Any, Budget]:
    expr, source = parse_expr(text)
    budget = Budget(limits, source)
    return evaluate(expr, scope, source, budget), budget


def fails(text: str, limits: Limits = DEFAULT, **scope: Any) -> EvaluationError:
    with pytest.raises(EvaluationError) as info:
        run(text, limits, **scope)
    return info.value


def spent(text: str, **scope: Any) -> int:
    _, budget = run(text, **scope)
    return budget.limits.steps - budget.steps_left


def test_limits_are_a_frozen_dataclass_with_checked_fields() -> None:
    limits = Limits()
    assert (limits.steps, limits.output_chars, limits.int_bits) == (1_000_000, 1_000_000,
                                                                    10_000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.steps = 5  # type: ignore[misc]
    assert Limits(steps=10**9).steps == 10**9 and hash(Limits()) == hash(Limits())
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(UsageError, match="Limits.steps must be a positive integer"):
            Limits(steps=bad)  # type: ignore[arg-type]


def test_each_node_is_a_step() -> None:
    assert spent("1") == 1
    assert spent("a + b * 2", a=1, b=2) == 5
    assert spent("x if c else y", x=1, c=True, y=2) == 3  # the branch not taken is free


def test_running_out_of_steps_is_positioned_with_a_note() -> None:
    err = fails("[1, 2, 3, 4, 5, 6]", Limits(steps=4))
    assert err.message == "the run took more than 4 evaluation steps"
    assert (err.span.line, err.span.column) == (1, 14)  # the node that found the budget empty
    assert any("Limits(steps=...)" in note for note in err.notes)
    # 7 nodes, and a list of 12 items as printed (6 entries, 6 scalars): 3 more steps.
    assert run("[1, 2, 3, 4, 5, 6]", Limits(steps=10))[0] == [1, 2, 3, 4, 5, 6]
    assert fails("[1, 2, 3, 4, 5, 6]", Limits(steps=9)).span.column == 4


@pytest.mark.parametrize(("text", "scope", "at_least"), [
    ("range(100000)", {}, 100_000 // ITEMS_PER_STEP),
    ("s + s", {"s": "x" * 1_000_000}, 2_000_000 // CHARS_PER_STEP),
    ("s | upper", {"s": "x" * 1_000_000}, 2_000_000 // CHARS_PER_STEP),
    ("xs | join(',')", {"xs": ["ab"] * 10_000}, 10_000 // ITEMS_PER_STEP),
    ("str(xs)", {"xs": list(range(10_000))}, 20_000 // ITEMS_PER_STEP),
    ("xs == ys", {"xs": [[0] * 100] * 100, "ys": [[0] * 100] * 100}, 20_000 // ITEMS_PER_STEP),
    ("'z' in xs", {"xs": ["a"] * 10_000}, 10_000 // ITEMS_PER_STEP),
    ("xs[1:]", {"xs": list(range(10_000))}, 9_999 // ITEMS_PER_STEP),
    ("max(xs)", {"xs": list(range(10_000))}, 10_000 // ITEMS_PER_STEP),
])
def test_work_that_grows_with_size_is_charged_by_size(text: str, scope: dict[str, Any],
                                                      at_least: int) -> None:
    assert spent(text, **scope) >= at_least


@pytest.mark.parametrize(("text", "scope"), [
    ("len(xs)", {"xs": list(range(100_000))}),
    ("xs[5]", {"xs": list(range(100_000))}),
    ("xs", {"xs": list(range(100_000))}),
    ("d.k", {"d": dict.fromkeys(map(str, range(100_000)), 1) | {"k": 1}}),
    ("'k' in d", {"d": dict.fromkeys(map(str, range(100_000)), 1)}),
    ("3 in xs", {"xs": list(range(20))}),
])
def test_reading_a_big_value_is_cheap(text: str, scope: dict[str, Any]) -> None:
    assert spent(text, **scope) <= 12


def test_a_shared_structure_costs_what_it_prints() -> None:
    # 3 distinct lists in memory, ~2.4M items when compared or printed: charged as printed.
    limits = Limits(steps=100_000)
    err = fails("a == b", limits, a=[[0] * 1200] * 1000, b=[[0] * 1200] * 1000)
    assert "evaluation steps" in err.message and err.span.column == 4


@pytest.mark.parametrize("text", [
    "n + n", "n * 2", "n - -n", "(n + n) // 1", "abs(n * 2)", "int(s)", "2 ** 10001",
    "(2 ** 5001) * (2 ** 5000)",
])
def test_every_integer_an_operation_computes_is_bounded(text: str) -> None:
    err = fails(text, n=2 ** 9_999, s="9" * 4_000)
    assert "would exceed 2**10000" in err.message or "integer too large (more than 10000 " \
        "bits)" in err.message, err.message
    assert any("Limits(int_bits=...)" in note for note in err.notes)


def test_integers_up_to_the_limit_are_fine_and_the_limit_can_be_raised() -> None:
    assert run("n + n", n=2 ** 9_998)[0] == 2 ** 9_999
    assert run("(2 ** 5000) * (2 ** 4999)")[0] == 2 ** 9_999
    assert run("n + n", Limits(int_bits=20_000), n=2 ** 9_999)[0] == 2 ** 10_000
    assert run("x", n=0, x=2 ** 12_000)[0] == 2 ** 12_000  # reading an input is no operation


def test_evaluate_text_converts_like_the_runtime() -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("x", {"x": None}, ""), ("x", {"x": True}, "true"), ("x", {"x": [1, "a"]}, '[1, "a"]'),
        ("x", {"x": {"k": None}}, '{"k": null}'), ("1.5", {}, "1.5")]
    for text, scope, expected in cases:
        expr, source = parse_expr(text)
        assert evaluate_text(expr, scope, source) == expected


def test_a_value_too_large_for_the_output_left_is_refused_before_printing() -> None:
    expr, source = parse_expr("xs")
    budget = Budget(Limits(output_chars=1_000), source)
    with pytest.raises(EvaluationError, match="too large to print") as info:
        evaluate_text(expr, {"xs": list(range(2_000))}, source, budget)
    assert any("Limits(output_chars=...)" in note for note in info.value.notes)


def test_an_integer_python_cannot_print_is_an_evaluation_error() -> None:
    expr, source = parse_expr("n * n")
    budget = Budget(Limits(int_bits=40_000), source)
    with pytest.raises(EvaluationError, match="cannot print the value"):
        evaluate_text(expr, {"n": 10 ** 4_000}, source, budget)


def test_budget_output_and_loops() -> None:
    source = Source("e.tmpl", "ab\ncd")
    budget = Budget(Limits(steps=100, output_chars=10), source)
    budget.step(source.span_at(3, 2))
    budget.output("12345")
    assert budget.steps_left == 100 - 1 - EMIT_STEPS and budget.output_left == 5
    with pytest.raises(EvaluationError, match="emit more than 10 characters") as info:
        budget.output("123456")
    assert (info.value.span.line, info.value.span.column) == (2, 1)
    with pytest.raises(EvaluationError, match="this loop has 1,000 iterations, more than"):
        budget.loop(1_000, source.span_at(0, 2))
