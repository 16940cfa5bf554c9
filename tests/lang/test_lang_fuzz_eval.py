"""Property-based fuzzing of the whole pipeline past the parser: templates and expressions built
from grammar pieces, with hostile input values (huge strings and integers, deep and shared
nesting, cycles, lone surrogates, NaN/inf, callables, objects), compile, evaluate and run (the
hole-free ones through the executor on the tiny model) to a result or a QrunError, and nothing
else: no other exception, no hang. Derandomized (stable in CI), with a fixed example count
that keeps each test at a few seconds, small run Limits, and an alarm that turns a hang into a
failure."""

from __future__ import annotations

import json
import math
from typing import Any

from hang import alarm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qrun.api import Query
from qrun.backends.transformers import TransformersBackend
from qrun.errors import QrunError, TemplateError, TemplateErrors, UsageError
from qrun.lang import compile_source, ir
from qrun.lang.builtins import FUNCTIONS, TESTS
from qrun.lang.evaluate import evaluate, evaluate_text
from qrun.lang.inputs import plain_inputs
from qrun.lang.ir_dump import dump_program
from qrun.limits import Budget, Limits
from qrun.options import RunOptions

LIMITS = Limits(steps=20_000, output_chars=20_000)
"""Small enough that any run ends in milliseconds; the property does not depend on the size."""
ALARM_S = 10
"""A single example running this long is a hang (they take milliseconds)."""
NAMES = ["x", "y", "s", "xs", "d", "n"]


FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- expressions from grammar pieces ------------------------------------------------------------

_STRINGS = st.one_of(
    st.text(max_size=6).map(json.dumps),  # escapes as JSON writes them, lone surrogates too
    st.sampled_from(['"\\ud800"', "'\\udc00x'", '"\\ud83d\\ude00"', '"\\x00\\n\\t"', r'"\d+"',
                     '"\\U0010ffff"', "'it''s'", '"%s"', '"{{"', '""', "'a' * 3"]),
)
_NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=10 ** 20).map(str),
    st.floats(min_value=0, allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["9" * 3999, "1e308", "1e309", ".5", "0", "100000", "10000"]),
)
_ATOMS = st.one_of(_STRINGS, _NUMBERS, st.sampled_from(
    [*NAMES, "loop", "loop.index", "true", "none", "False", "[]", "{}", "_x", "nope"]))
_FUNCS = [*FUNCTIONS, "eval", "getattr", "sorted", "map", "d"]
_KEYWORDS = ["key", "sep", "chars", "count", "ndigits", "maxsplit", "default", "precision",
             "method", "default_value", "boolean", "reverse", "case_sensitive", "attribute",
             "indent"]
_BINARY = ["+", "-", "*", "/", "//", "%", "**", "~"]
_COMPARE = ["==", "!=", "<", "<=", ">", ">=", "in", "not in"]
_TESTS = [*TESTS, "divisibleby(2)", "string(1)", "y"]
_METHODS = ["items()", "keys()", "values()", "upper()", "get('k')", "items(1)"]


def _compound(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    args = st.lists(children, max_size=3)
    kwargs = st.lists(st.tuples(st.sampled_from(_KEYWORDS), children), max_size=2)
    call_args = st.tuples(args, kwargs).map(
        lambda a: ", ".join([*a[0], *(f"{k}={v}" for k, v in a[1])]))
    return st.one_of(
        st.tuples(st.sampled_from(["-", "+", "not "]), children).map("".join),
        st.tuples(children, st.sampled_from(_BINARY), children).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(children, st.sampled_from(_COMPARE), children).map(" ".join),
        st.tuples(children, st.sampled_from(["and", "or"]), children).map(" ".join),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.tuples(children, st.sampled_from(["k", "index", "__class__", "a"])).map(".".join),
        st.tuples(children, st.sampled_from(["is", "is not"]), st.sampled_from(_TESTS)).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(children, st.sampled_from(_METHODS)).map(lambda t: f"{t[0]}.{t[1]}"),
        st.tuples(children, children).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(children, children, children).map(lambda t: f"{t[0]}[{t[1]}:{t[2]}]"),
        st.tuples(st.sampled_from(_FUNCS), call_args).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(children, st.sampled_from(_FUNCS), call_args).map(
            lambda t: f"{t[0]} | {t[1]}({t[2]})"),
        st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(st.tuples(children, children), max_size=3).map(
            lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"),
    )


EXPRESSIONS = st.recursive(_ATOMS, _compound, max_leaves=10)

# ---- hostile input values -----------------------------------------------------------------------


def _deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def _shared(levels: int) -> Any:
    value: Any = [0]
    for _ in range(levels):
        value = [value, value]
    return value


def _cycle() -> Any:
    value: list[Any] = [1]
    value.append(value)
    return value


_HOSTILE = [
    "x" * 2_000_000, "\ud800", "ok\udfff", ["\udc80"], 10 ** 3999, -(2 ** 9_999), 10 ** 4299,
    math.nan, math.inf, -math.inf, -0.0, _deep(99), _deep(150), _shared(12), _cycle(),
    list(range(5_000)), {"k": list(range(1000))}, print, (lambda: 1), object(), {1, 2},
    b"bytes", (1, "t"), range(5), {"__class__": 1, "k": "v"}, {(1,): 2},
]
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 80), max_value=2 ** 80),
    st.floats(), st.text(max_size=12), st.sampled_from(_HOSTILE),
)
VALUES = st.recursive(_SCALARS, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(st.sampled_from(["k", "a", "index", "_x"]), c,
                                             max_size=3)), max_leaves=8)
INPUTS = st.fixed_dictionaries({name: VALUES for name in NAMES})

# ---- templates from grammar pieces --------------------------------------------------------------


def _statements(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(children, min_size=2, max_size=3).map("".join),
        st.tuples(EXPRESSIONS, children).map(lambda t: f"{{% if {t[0]} %}}{t[1]}{{% endif %}}"),
        st.tuples(EXPRESSIONS, children, children).map(
            lambda t: f"{{% if {t[0]} %}}{t[1]}{{% else %}}{t[2]}{{% endif %}}"),
        st.tuples(st.sampled_from(["i", "x", "loop", "k, v", "a, a"]), EXPRESSIONS,
                  children).map(lambda t: f"{{% for {t[0]} in {t[1]} %}}{t[2]}{{% endfor %}}"),
        st.tuples(st.sampled_from(["user", "system", "assistant"]), children).map(
            lambda t: f"{{% {t[0]} %}}{t[1]}{{% end{t[0]} %}}"),
    )


_LEAF_STATEMENTS = st.one_of(
    st.text(alphabet="ab \n\r\t{}%#-é\ufeff", max_size=6),
    EXPRESSIONS.map(lambda e: f"{{{{ {e} }}}}"),
    st.tuples(st.sampled_from(["v", "w", "n"]), EXPRESSIONS).map(
        lambda t: f"{{% set {t[0]} = {t[1]} %}}"),
    st.sampled_from(["{# c #}", "{% raw %}{{ x }}{% endraw %}", "{{- x -}}", "\n{%- if x -%}"
                     "{% endif %}", "---\nmax_tokens: 3\n---\n", "{% break %}",
                     "{% continue %}", "{% if x is defined %}{% break %}{% endif %}",
                     "{% include 'other.tmpl' %}", "{{ opt | default(x) }}"]),
)
HOLES = st.sampled_from(['{{ gen g max_tokens=n }}', '{{ gen g regex=s }}', '{{ gen g json=d }}',
                         '{{ select c options=xs }}', '{{ gen g stop=[s, "\\ud800"] }}'])
TEMPLATES = st.recursive(_LEAF_STATEMENTS, _statements, max_leaves=8)


# ---- the properties -----------------------------------------------------------------------------


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """The inputs as a run sees them: plain_inputs' copy, or a UsageError and a stand-in."""
    try:
        return plain_inputs(values)
    except UsageError as err:
        assert str(err).startswith("input '"), str(err)
        return {name: [1, "a", {"k": None}] for name in NAMES}


@FUZZ
@given(EXPRESSIONS, INPUTS)
def test_expressions_compile_and_evaluate_to_a_value_or_a_qrun_error(
        text: str, values: dict[str, Any]) -> None:
    with alarm(ALARM_S):
        scope = _plain(values)
        try:
            program = compile_source("{{ " + text + " }}", "fuzz.tmpl")
        except TemplateErrors as errors:
            assert all(isinstance(err, TemplateError) for err in errors.errors)
            return
        (op,) = program.ops
        assert isinstance(op, ir.EmitValue)
        try:
            evaluate(op.expr, scope, program.source, Budget(LIMITS, program.source))
            rendered = evaluate_text(op.expr, scope, program.source,
                                     Budget(LIMITS, program.source))
            rendered.encode("utf-8")  # never a string no tokenizer could read
        except QrunError as err:
            assert 0 <= err.span.start <= err.span.end <= len(program.source.text)  # type: ignore[attr-defined]
            str(err).encode("utf-8")


@FUZZ
@given(TEMPLATES, st.one_of(st.none(), HOLES))
def test_templates_compile_or_raise_template_errors(body: str, hole: str | None) -> None:
    with alarm(ALARM_S):
        text = body + (hole or "")
        try:
            program = compile_source(text, "fuzz.tmpl")
        except TemplateError as err:
            assert isinstance(err, TemplateErrors)
            for each in err.errors:
                assert 0 <= each.span.start <= each.span.end <= len(each.source.text)
            str(err).encode("utf-8")
            return
        assert dump_program(program) == dump_program(compile_source(text, "fuzz.tmpl"))


@settings(FUZZ, max_examples=100)
@given(TEMPLATES, INPUTS)
def test_hole_free_templates_run_to_a_result_or_a_qrun_error(
        tiny: TransformersBackend, body: str, values: dict[str, Any]) -> None:
    with alarm(ALARM_S):
        try:
            program = compile_source(body, "fuzz.tmpl")
        except TemplateErrors:
            return
        inputs = {name: values.get(name, 0) for name in program.inputs}
        try:
            result = Query(program).run(inputs, model=tiny,
                                        options=RunOptions(max_tokens=1, limits=LIMITS))
        except QrunError as err:
            str(err).encode("utf-8")
            return
        assert len(result.text) <= LIMITS.output_chars
        result.text.encode("utf-8")
