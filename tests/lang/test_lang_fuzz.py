"""Property-based fuzzing of the whole front end: random text and random mutations of realistic
templates either compile or raise TemplateErrors, never another exception; compiled programs
dump deterministically and their expressions evaluate or raise EvaluationError only.
Deterministic (derandomize=True) and bounded to a few seconds."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qrun.errors import EvaluationError, TemplateErrors
from qrun.lang import compile_source, ir
from qrun.lang.evaluate import LoopInfo, evaluate
from qrun.lang.ir_dump import dump_program

SEEDS = [
    'Q: {{ question }}\nA: {{ gen answer stop="\\n" max_tokens=32 }}\n',
    '---\nmodel: smollm2\ntemperature: 0.2\ninputs: [items, schema]\n---\n'
    '{% for it in items -%}\n{{ loop.index }}. {{ it | upper }} {{ gen d regex=INT }}\n'
    '{%- endfor %}\n{{ gen j json=schema }}',
    '{% system %}Be brief.{% endsystem %}{% user %}{{ q }}{% enduser %}'
    '{% assistant %}{{ select a options=["yes", "no"] normalize="mean" }}{% endassistant %}',
    '{% if x > 1 and not y %}{{ gen a json={"type": "object", "properties": '
    '{"n": {"type": "integer"}}} }}{% elif z in [1, 2] %}{% set w = z * 2 %}{{ w }}'
    '{% else %}{# nothing #}{% raw %}{{ literal }}{% endraw %}{% endif %}',
    '{{ names | join(", ") | replace("a", "b") }} {{ d["k"][1:3] }} {{ a if b else c }}'
    ' {{ len(range(3)) + -2 ** 2 // 1 % 5 }}',
    '{% for k, v in d.items() | sort(attribute="1") %}{% if v is none %}{% continue %}{% endif %}'
    '{{ k ~ "=" ~ v | round(1) }}{% if loop.index > n | default(3) %}{% break %}{% endif %}'
    '{% endfor %}{% if x is defined %}{{ x | trim | title }}{% endif %}{{ xs | unique | tojson }}',
]
SNIPPETS = [
    "{{", "}}", "{%", "%}", "{#", "#}", "{{-", "-}}", "{%-", "-%}", "{{ gen x }}",
    "{{ select s options=['a'] }}", "{% if a %}", "{% endif %}", "{% else %}", "{% elif b %}",
    "{% for i in xs %}", "{% endfor %}", "{% set v = 1 %}", "{% user %}", "{% enduser %}",
    "{% raw %}", "{% endraw %}", "---\n", "\n---\n", "inputs: [a]\n", '"', "'", "\\", "{", "}",
    "[", "]", "(", ")", ",", ":", "=", "|", ".", "-", "**", "not ", " in ", "__class__", "_x",
    "regex=INT", "regex=EMIAL", 'regex="(a"', "json={}", "max_tokens=0", "\x00", "é", "\n",
    "{% break %}", "{% continue %}", "{% include 'x.tmpl' %}", "{% for k, v in d.items() %}",
    " is defined", " is not none", " ~ ", " | default(1)", ".items()", ".upper()", "{% extends",
]
ALPHABET = "{}%#-=|[]()\"'.,:!<>+*/ \n\tabgenxyz_019"

mutation = st.tuples(
    st.sampled_from(["insert", "delete", "replace", "splice"]),
    st.floats(min_value=0, max_value=1), st.integers(min_value=1, max_value=6),
    st.sampled_from(SNIPPETS), st.text(alphabet=ALPHABET, min_size=1, max_size=3))


def mutate(text: str, ops: list[tuple[str, float, int, str, str]]) -> str:
    for kind, where, size, snippet, chars in ops:
        pos = int(where * len(text))
        if kind == "insert":
            text = text[:pos] + chars + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + size:]
        elif kind == "replace":
            text = text[:pos] + chars + text[pos + len(chars):]
        else:
            text = text[:pos] + snippet + text[pos:]
    return text


def check(text: str) -> None:
    """The property: compile or TemplateErrors; results are well-formed either way."""
    try:
        program = compile_source(text, "fuzz.tmpl")
    except TemplateErrors as errors:
        for err in errors.errors:
            assert 0 <= err.span.start <= err.span.end <= len(text)
            assert err.render().startswith(f"fuzz.tmpl:{err.span.line}:{err.span.column}: ")
        return
    assert dump_program(program) == dump_program(compile_source(text, "fuzz.tmpl"))
    scope: dict[str, Any] = {name: [1, "a"] for name in program.inputs}
    scope["loop"] = LoopInfo(0, 2)
    for op in ir.walk(program.ops):
        for expr in ir.exprs(op):
            try:
                evaluate(expr, scope, program.source)
            except EvaluationError:
                pass


FUZZ = settings(max_examples=400, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.sampled_from(SEEDS), st.lists(mutation, min_size=1, max_size=4))
def test_mutated_templates(seed: str, ops: list[tuple[str, float, int, str, str]]) -> None:
    check(mutate(seed, ops))


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(SNIPPETS), st.text(alphabet=ALPHABET, max_size=4)),
                max_size=12))
def test_random_snippet_soup(parts: list[str]) -> None:
    check("".join(parts))


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_unicode(text: str) -> None:
    check(text)


EXPR_PARTS = ["x", "y", "1", "0", "-1", "2.5", "'s'", '"t"', "[1, 2]", "{'k': 1}", "none",
              "true", "(", ")", "[", "]", "+", "-", "*", "/", "//", "%", "**", "==", "<", "in",
              "not", "and", "or", "if", "else", ".k", "[0]", "[1:]", "| upper", "| join(',')",
              "len(", "range(", "int(", "str(", "min(", "round(", "replace(", ",", " ", "~",
              "is defined", "is not none", "is number", "is divisibleby(2)", "| default(",
              "| first", "| last", "| sort(reverse=true)", "| unique", "| tojson", "| title",
              "| trim", ".items()", ".keys()", ".upper()", "missing"]


@FUZZ
@given(st.lists(st.sampled_from(EXPR_PARTS), min_size=1, max_size=10),
       st.sampled_from([0, "ab", [3, 1], {"k": "v"}, None, 2.5]))
def test_random_expressions_evaluate_or_fail_cleanly(parts: list[str], value: Any) -> None:
    check("{{ " + " ".join(parts) + " }}")
    text = "{% set r = " + " ".join(parts) + " %}"
    try:
        program = compile_source(text)
    except TemplateErrors:
        return
    (op,) = program.ops
    assert isinstance(op, ir.Set)
    try:
        evaluate(op.expr, {"x": value, "y": value}, program.source)
    except EvaluationError as err:
        assert 0 <= err.span.start <= err.span.end <= len(text)
