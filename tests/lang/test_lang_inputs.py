"""No value from the inputs is ever called. Two levels: lang/inputs.py copies inputs into plain
data (str, int, float, bool, None, lists and dicts) and refuses anything else with the input's
name and the path inside it; lang/evaluate.py calls only its stdlib functions, with only their
documented keywords, and never with a callable argument."""

from __future__ import annotations

import math
import os
from collections import OrderedDict, UserDict, UserList
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import qrun
import qrun.lang.inputs
from qrun.errors import EvaluationError, TemplateErrors, UsageError
from qrun.lang import ast as ast_nodes
from qrun.lang import build_ast, compile_source, parse
from qrun.lang.builtins import FUNCTIONS, KEYWORDS
from qrun.lang.evaluate import evaluate
from qrun.lang.inputs import MAX_INPUT_DEPTH, MAX_INPUT_ITEMS, plain_inputs
from qrun.source import Source


class Spy:
    """A callable that records every call: the tests assert it is never called."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        self.calls.append(args)
        return 0


class LoudStr(str):
    """A str subclass whose own methods must never run once it is an input."""

    def __str__(self) -> str:
        raise AssertionError("__str__ called")

    def __eq__(self, other: object) -> bool:
        raise AssertionError("__eq__ called")

    __hash__ = str.__hash__


class LoudInt(int):
    def __int__(self) -> int:
        raise AssertionError("__int__ called")

    def __add__(self, other: object) -> int:
        raise AssertionError("__add__ called")


class LoudFloat(float):
    def __float__(self) -> float:
        raise AssertionError("__float__ called")


class Records(Mapping[str, Any]):
    """A read-only Mapping that is not a dict."""

    def __init__(self, **values: Any) -> None:
        self.data = values

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def parse_expr(text: str) -> tuple[Any, Source]:
    source = Source("e.tmpl", "{{ " + text + " }}")
    node = build_ast(parse(source), source).body[0]
    assert isinstance(node, ast_nodes.Interp)
    return node.expr, source


# ---- plain_inputs: the boundary ----------------------------------------------------------------


def test_containers_become_plain_lists_and_dicts() -> None:
    values = {
        "t": (1, (2, 3)), "r": range(3), "m": Records(a=(1,), b=Records(c="x")),
        "u": UserDict({"k": UserList([1])}), "o": OrderedDict(z=1), "n": None,
        "f": [math.nan, math.inf, -0.0], "b": [True, False], "keys": {1: "a", 2.5: "b", None: 0},
    }
    plain = plain_inputs(values)
    assert plain == {
        "t": [1, [2, 3]], "r": [0, 1, 2], "m": {"a": [1], "b": {"c": "x"}},
        "u": {"k": [1]}, "o": {"z": 1}, "n": None, "f": plain["f"], "b": [True, False],
        "keys": {1: "a", 2.5: "b", None: 0},
    }
    assert type(plain["m"]) is dict and type(plain["u"]["k"]) is list
    assert math.isnan(plain["f"][0]) and plain["f"][1:] == [math.inf, -0.0]


def test_inputs_are_copies() -> None:
    items = [{"a": 1}]
    plain = plain_inputs({"items": items})
    plain["items"][0]["a"] = 2
    assert items == [{"a": 1}]


def test_subclasses_become_the_base_type_without_running_their_methods() -> None:
    plain = plain_inputs({"s": LoudStr("hi"), "i": LoudInt(5), "x": LoudFloat(1.5),
                          "d": {LoudStr("k"): [LoudInt(1)]}})
    assert plain == {"s": "hi", "i": 5, "x": 1.5, "d": {"k": [1]}}
    assert type(plain["s"]) is str and type(plain["i"]) is int and type(plain["x"]) is float
    assert type(next(iter(plain["d"]))) is str and type(plain["d"]["k"][0]) is int


@pytest.mark.parametrize(("value", "where", "message"), [
    (os.system, "input 'v'", "builtin_function_or_method is not plain data"),
    ({"run": os.system}, "input 'v' at ['run']", "builtin_function_or_method"),
    ([1, {"k": [lambda: 1]}], "input 'v' at [1]['k'][0]", "a function is not plain data"),
    ({"obj": object()}, "input 'v' at ['obj']", "a object is not plain data"),
    ([{1, 2}], "input 'v' at [0]", "a set is not plain data"),
    (b"bytes", "input 'v'", "bytes are not text"),
    ([bytearray(b"x")], "input 'v' at [0]", "bytes are not text"),
    ((x for x in "ab"), "input 'v'", "a generator is not plain data"),
    (Spy(), "input 'v'", "a Spy is not plain data"),
    (["ok", "a\ud800"], "input 'v' at [1]", "lone surrogate U+D800"),
    ({"\udc80": 1}, "input 'v' at ['\\udc80']", "lone surrogate U+DC80"),
    ({(1, 2): "x"}, "input 'v' at [(1, 2)]", "a dict key of type tuple"),
    ([10 ** 4000], "input 'v' at [0]", "more than 4000 digits"),
])
def test_anything_else_is_refused_naming_the_input_and_path(value: Any, where: str,
                                                            message: str) -> None:
    with pytest.raises(UsageError) as info:
        plain_inputs({"v": value})
    text = str(info.value)
    assert text.startswith(where + ": ") and message in text, text
    assert info.value.exit_code == 2


def test_the_largest_integer_allowed_has_4000_digits() -> None:
    assert plain_inputs({"n": -(10 ** 4000 - 1)})["n"] == -(10 ** 4000 - 1)


def test_cycles_are_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(UsageError, match=r"input 'v' at \[1\]: the value contains itself"):
        plain_inputs({"v": loop})
    mapping: dict[str, Any] = {}
    mapping["me"] = [mapping]
    with pytest.raises(UsageError, match=r"at \['me'\]\[0\]: the value contains itself"):
        plain_inputs({"v": mapping})


def test_shared_values_are_fine_and_copied() -> None:
    shared = [1, 2]
    plain = plain_inputs({"v": [shared, shared, {"again": shared}]})
    assert plain["v"] == [[1, 2], [1, 2], {"again": [1, 2]}]


def test_depth_is_bounded() -> None:
    ok: Any = "leaf"
    for _ in range(MAX_INPUT_DEPTH):
        ok = [ok]
    plain_inputs({"v": ok})
    with pytest.raises(UsageError, match=r"at \[0\]\[0\]\[0\]\[0\]…\[0\]\[0\]\[0\]: the value "
                                         r"is nested more than 100 levels deep"):
        plain_inputs({"v": [ok]})


def test_size_is_bounded_even_for_exponential_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match=f"more than {MAX_INPUT_ITEMS:,} items"):
        plain_inputs({"v": range(10 ** 9)})
    # 2**40 leaves when copied, a few bytes in memory: refused after MAX_INPUT_ITEMS copies
    # (lowered here to keep the test fast).
    monkeypatch.setattr(qrun.lang.inputs, "MAX_INPUT_ITEMS", 10_000)
    value: Any = [0]
    for _ in range(40):
        value = [value, value]
    with pytest.raises(UsageError, match="more than 10,000 items"):
        plain_inputs({"a": [1, 2], "v": value})


# ---- the evaluator never calls a value ---------------------------------------------------------


def test_the_reproduction_does_not_compile() -> None:
    with pytest.raises(TemplateErrors) as info:
        compile_source("{{ max(['touch pwned.txt'], key=t.run) }}")
    assert "max() has no keyword argument 'key'" in info.value.first.message


@pytest.mark.parametrize("text", [
    "max(xs, key=f)", "min(xs, key=f)", "max(xs, default=f)", "xs | join(sep=',', key=f)",
    "round(1.5, precision=1, key=f)", "split('a b', key=f)", "len(xs, key=f)",
])
def test_undocumented_keywords_are_refused_at_run_time_too(text: str) -> None:
    spy = Spy()
    expr, source = parse_expr(text)
    with pytest.raises(EvaluationError, match="has no keyword argument"):
        evaluate(expr, {"xs": ["a", "b"], "f": spy}, source)
    assert spy.calls == []


@pytest.mark.parametrize("text", [
    "max(xs, f)", "min(f, f)", "f | str", "str(f)", "len(f)", "[f] | join", "abs(f)",
    "range(f)", "round(f, 2)", "xs | join(f)",
])
def test_a_callable_is_never_passed_to_a_function(text: str) -> None:
    # plain_inputs makes this unreachable from a run; evaluate alone still refuses it.
    spy = Spy()
    expr, source = parse_expr(text)
    try:
        evaluate(expr, {"xs": ["a"], "f": spy}, source)
    except EvaluationError as err:
        assert "function" in err.message or "expects" in err.message, err.message
    assert spy.calls == []


def test_documented_keywords_still_work() -> None:
    for text, expected in [("strip('xax', chars='x')", "a"), ("join(['a', 'b'], sep='-')",
                                                             "a-b"),
                           ("replace('aaa', 'a', 'b', count=2)", "bba"),
                           ("split('a,b,c', sep=',', maxsplit=1)", ["a", "b,c"]),
                           ("round(2.567, precision=1)", 2.6)]:
        expr, source = parse_expr(text)
        assert evaluate(expr, {}, source) == expected


def test_keyword_table_names_only_documented_functions() -> None:
    assert set(KEYWORDS) <= set(FUNCTIONS)
    assert KEYWORDS == {"strip": ("chars",), "join": ("sep",), "replace": ("count",),
                        "split": ("sep", "maxsplit"), "round": ("precision", "method"),
                        "default": ("default_value", "boolean"), "tojson": ("indent",),
                        "trim": ("chars",), "sort": ("reverse", "case_sensitive", "attribute"),
                        "unique": ("case_sensitive", "attribute")}


def test_inputs_are_copied_once_per_run(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Query.run and the run both check a run's inputs (the command line too, before the model
    # loads): the plain copy, whose cost grows with the inputs, is made once.
    from qrun.lang import ir

    copies: list[int] = []
    real = ir.plain_inputs

    def counting(values: Any) -> Any:
        copies.append(1)
        return real(values)

    monkeypatch.setattr(ir, "plain_inputs", counting)
    query = qrun.Query("{{ doc | length }}")
    assert query.run({"doc": "x" * 1000}, model=tiny).text == "1000"
    assert len(copies) == 1
    checked = query.program.check_inputs({"doc": "abc"})
    assert query.run(checked, model=tiny).text == "3" and len(copies) == 2
    # Checked by another program, they are checked again.
    assert qrun.Query("{{ doc }}!").run(checked, model=tiny).text == "abc!"
    assert len(copies) == 3
