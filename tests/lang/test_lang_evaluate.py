"""The expression interpreter: every operator and stdlib function, Python semantics, LoopInfo,
and failures as EvaluationError at the failing node's span (never a raw Python exception)."""

from __future__ import annotations

from typing import Any

import pytest

from qrun.errors import EvaluationError
from qrun.lang import ast as ast_nodes
from qrun.lang import build_ast, parse
from qrun.lang.builtins import FUNCTIONS, MAX_RANGE
from qrun.lang.evaluate import LoopInfo, evaluate
from qrun.lang.expr import Attr, Const, Expr, Name
from qrun.source import Source, Span


def parse_expr(text: str) -> tuple[Expr, Source]:
    source = Source("e.tmpl", "{{ " + text + " }}")
    template = build_ast(parse(source), source)
    node = template.body[0]
    assert isinstance(node, ast_nodes.Interp)
    return node.expr, source


def ev(text: str, **scope: Any) -> Any:
    expr, source = parse_expr(text)
    return evaluate(expr, scope, source)


def fails(text: str, **scope: Any) -> EvaluationError:
    expr, source = parse_expr(text)
    with pytest.raises(EvaluationError) as info:
        evaluate(expr, scope, source)
    return info.value


@pytest.mark.parametrize(("text", "expected"), [
    ("1 + 2", 3), ("7 - 10", -3), ("3 * 4", 12), ("7 / 2", 3.5), ("7 // 2", 3), ("-7 // 2", -4),
    ("7 % 3", 1), ("-7 % 3", 2), ("2 ** 10", 1024), ("2 ** -1", 0.5), ("-2 ** 2", -4),
    ("+3", 3), ("-(-3)", 3), ("1.5 * 2", 3.0), ('"ab" + "cd"', "abcd"), ('"ab" * 3', "ababab"),
    ("3 * [0]", [0, 0, 0]), ("[1] + [2]", [1, 2]),
    ("1 < 2 < 3", True), ("1 < 3 < 2", False), ("1 == 1.0", True), ("1 != 2", True),
    ("2 >= 2 > 1", True), ("1 <= 0", False), ('"a" in "cat"', True), ("4 not in [1, 2]", True),
    ('"k" in {"k": 1}', True), ("none is none", True), ("1 is not none", True),
    ("not 0", True), ("not [1]", False), ("0 or 3", 3), ("2 and 3", 3), ("0 and 1/0", 0),
    ("1 or 1/0", 1), ("none or false or 0", 0), ('1 if true else 1/0', 1),
    ('1/0 if false else "no"', "no"), ("[1, 2][0]", 1), ("[1, 2][-1]", 2), ('"abc"[1]', "b"),
    ('{"a": {"b": 5}}["a"]["b"]', 5), ('{"a": {"b": 5}}.a.b', 5),
    ('"abcdef"[1:3]', "bc"), ('"abcdef"[::2]', "ace"), ("[1, 2, 3][-2:]", [2, 3]),
    ('"abc"[::-1]', "cba"), ("[1, 2, 3][:]", [1, 2, 3]), ("{1: 2}", {1: 2}), ("[]", []),
])
def test_operators(text: str, expected: Any) -> None:
    result = ev(text)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ('len("abc")', 3), ("len([1, 2])", 2), ('"abc" | len', 3), ("range(3)", [0, 1, 2]),
    ("range(1, 7, 2)", [1, 3, 5]), ('int("42")', 42), ("int(3.9)", 3), ('float("2.5")', 2.5),
    ("str(12)", "12"), ('lower("AbC")', "abc"), ('"AbC" | upper', "ABC"),
    ('strip("  x ")', "x"), ('"xxhixx" | strip("x")', "hi"), ('join(["a", "b"], "-")', "a-b"),
    ('["a", 1] | join(", ")', "a, 1"), ("[1, 2] | join", "12"),
    ('replace("aXbX", "X", "-")', "a-b-"), ('"aXbX" | replace("X", "")', "ab"),
    ('"aXbX" | replace("X", "-", 1)', "a-bX"), ('split("a,b", ",")', ["a", "b"]),
    ('"a b  c" | split', ["a", "b", "c"]), ("min(3, 1, 2)", 1), ("max([3, 9, 2])", 9),
    ("abs(-4)", 4), ("round(2.567, 2)", 2.57), ("round(2.5)", 2.0), ("round(x=1)", None),
])
def test_functions(text: str, expected: Any) -> None:
    if expected is None:  # a keyword the function does not take is an EvaluationError
        assert "round() has no keyword argument 'x'" in fails(text).message
        return
    result = ev(text)
    assert result == expected and type(result) is type(expected)


def test_function_table_is_exactly_the_documented_list() -> None:
    assert sorted(FUNCTIONS) == sorted(
        "len range int float str lower upper strip join replace split min max abs round "
        "default length tojson trim title capitalize first last sort unique".split())


def test_names_and_attributes() -> None:
    assert ev("user.name", user={"name": "Ada"}) == "Ada"
    assert ev("items[1] | upper", items=["a", "b"]) == "B"
    assert ev("x", x=None) is None


@pytest.mark.parametrize(("index0", "length", "fields"), [
    (0, 3, {"index": 1, "index0": 0, "first": True, "last": False, "length": 3,
            "revindex": 3, "revindex0": 2}),
    (2, 3, {"index": 3, "index0": 2, "first": False, "last": True, "length": 3,
            "revindex": 1, "revindex0": 0}),
])
def test_loop_info(index0: int, length: int, fields: dict[str, Any]) -> None:
    loop = LoopInfo(index0, length)
    for name, value in fields.items():
        assert ev(f"loop.{name}", loop=loop) == value


def test_loop_as_dict_also_works() -> None:
    assert ev("loop.index", loop={"index": 4}) == 4


@pytest.mark.parametrize(("text", "scope", "message", "column"), [
    ("missing", {}, "undefined variable 'missing'", 4),
    ("1 + missing", {}, "undefined variable 'missing'", 8),
    ("d.k", {"d": {"a": 1}}, "key 'k' not found", 4),
    ('d["k"]', {"d": {}}, "key 'k' not found", 4),
    ("xs[5]", {"xs": [1]}, "index 5 out of range (length 1)", 4),
    ('xs["a"]', {"xs": [1]}, "index must be an integer", 4),
    ("n[0]", {"n": 3}, "cannot be indexed", 4),
    ("n[1:]", {"n": 3}, "cannot be sliced", 4),
    ("s[::0]", {"s": "ab"}, "slice step cannot be zero", 4),
    ("n.attr", {"n": 3}, "a int value has no attribute 'attr'", 4),
    ("loop.nope", {"loop": LoopInfo(0, 1)}, "no attribute 'nope'", 4),
    ("1 / 0", {}, "division by zero", 4),
    ("5 // 0", {}, "division by zero", 4),
    ("5 % 0", {}, "division by zero", 4),
    ('1 + "a"', {}, "unsupported operand", 4),
    ('1 < "a"', {}, "not supported", 4),
    ('"%s" % x', {"x": 1}, "string formatting is not supported", 4),
    ("-s", {"s": "a"}, "bad operand for unary -", 4),
    ("(-8) ** 0.5", {}, "complex", 4),
    ('len(3)', {}, "len() failed", 4),
    ('int("x")', {}, "int() failed: invalid literal", 4),
    ('strip(3)', {}, "strip() expects a string, got int", 4),
    ('x | split', {"x": [1]}, "split() expects a string, got list", 4),
    ("min([])", {}, "min() failed", 4),
    ("[1, 2] + 3", {}, "can only concatenate", 4),
    ("{[1]: 2}", {}, "unhashable", 4),
    ("_x", {"_x": 1}, "names starting with '_'", 4),
    ("a__b", {"a__b": 1}, "containing '__'", 4),
    ("d._k", {"d": {"_k": 1}}, "attributes starting with '_'", 4),
    ("nope(1)", {}, "unknown function 'nope'", 4),
    ("2.0 ** 10000", {}, "Numerical result out of range", 4),
])
def test_errors(text: str, scope: dict[str, Any], message: str, column: int) -> None:
    err = fails(text, **scope)
    assert message in err.message, err.render()
    assert (err.span.line, err.span.column) == (1, column)


def test_error_points_at_the_failing_subexpression() -> None:
    err = fails("[1, 2, d.k, 4]", d={})
    assert err.span.column == 11 and err.span.end_column == 14


@pytest.mark.parametrize(("text", "message"), [
    ("range(10 ** 9)", "range() would have"),
    ("range(2 ** 200)", f"range() would have {2 ** 200} items"),
    ("range(0, -2 ** 70, -3)", "range() would have 393530540239137101142 items"),
    ('"ab" * 100000000', "repetition would exceed"),
    ("[0] * 100000000", "repetition would exceed"),
    ("100000000 * [0, 1]", "repetition would exceed"),
    ("[[0] * 10000] * 10000", "repetition would exceed"),
    ("2 ** 100000", "power would exceed"),
    ("10 ** 10 ** 10", "power would exceed"),
    ("(2 ** 9000) * (2 ** 9000)", "product would exceed"),
    ('"x" | replace("", s)', "replace() result would exceed"),
    ("round(5, -10 ** 9)", "round() takes at most 100 digits"),
    ("s + s", "result would exceed"),
])
def test_size_limits(text: str, message: str) -> None:
    err = fails(text, s="y" * 6_000_000)
    assert message in err.message, err.render()


def test_join_limit() -> None:
    err = fails('xs | join(s)', xs=["a"] * 100, s="z" * 200_000)
    assert "join() result would exceed" in err.message


def test_shared_structure_is_measured_as_printed() -> None:
    # 3000 x 3000 shared references: cheap in memory, 9M+ items when printed.
    err = fails("[a, a, a] * 1000", a=[0] * 3000)
    assert "repetition would exceed" in err.message


def test_large_inputs_are_fine() -> None:
    big = "x" * (20 * 10**6)
    assert ev("doc", doc=big) is big
    assert ev("doc[:3]", doc=big) == "xxx"
    assert ev("len(doc)", doc=big) == 20 * 10**6


def test_range_bound() -> None:
    assert len(ev(f"range({MAX_RANGE})")) == MAX_RANGE
    assert ev("range(10, 0, -3)") == [10, 7, 4, 1]
    assert ev("range(0, 10, 3)") == [0, 3, 6, 9]
    assert ev("range(5, 5)") == [] and ev("range(5, 0)") == []
    assert len(ev(f"range(-{MAX_RANGE}, 0)")) == MAX_RANGE
    assert "range() would have" in fails(f"range({MAX_RANGE + 1})").message


def test_evaluate_never_calls_python_eval() -> None:
    # A hand-built node with a dunder attribute is still refused at run time.
    span = Span(0, 1, 1, 1, 1, 2)
    node = Attr(Const("x", span), "__class__", span)
    with pytest.raises(EvaluationError, match="attributes starting with '_'"):
        evaluate(node, {}, Source("s", "x"))
    with pytest.raises(EvaluationError, match="names starting with '_'"):
        evaluate(Name("__builtins__", span), {"__builtins__": {}}, Source("s", "x"))
