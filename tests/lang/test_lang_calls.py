"""Static checks of macros, while, try/except and host function calls (docs/language.md §13,
§21-§22): what is an input and what is not, where each tag may stand, and the arguments of
every call to a macro or a registered host function."""

from __future__ import annotations

import pytest

from qrun.errors import TemplateErrors
from qrun.lang import compile_source, ir
from qrun.lang.signature import Signature

CALC = {"calc": Signature(("expression",), 1), "pick": Signature(("a", "b"), 1)}


def errors(text: str, functions: dict[str, Signature] | None = None) -> list[str]:
    with pytest.raises(TemplateErrors) as info:
        compile_source(text, functions=functions)
    return [e.message for e in info.value.errors]


def test_parameters_err_and_host_functions_are_not_inputs() -> None:
    program = compile_source(
        "{% macro f(a, b=a) %}{{ a }}{{ b }}{{ other }}{% endmacro %}"
        "{% try %}{{ calc(x) }}{% except err %}{{ err }}{% endtry %}{{ f(1) }}",
        functions=CALC)
    assert program.inputs == ("other", "x")
    assert set(program.macros) == {"f"} and set(program.host_calls) == {"calc"}


def test_while_captures_are_lists_and_its_test_reads_sets() -> None:
    program = compile_source("{% set n = 0 %}{% while n < 3 %}{% set n = n + 1 %}"
                             "{{ gen x }}{% endwhile %}{{ x | length }}")
    loop = program.ops[1]
    assert isinstance(loop, ir.While) and program.inputs == ()
    gen = loop.body[1]
    assert isinstance(gen, ir.Gen) and gen.in_loop


def test_break_in_a_while_and_not_in_a_macro_body_outside_loops() -> None:
    compile_source("{% while true %}{% break %}{% endwhile %}")
    assert errors("{% macro m() %}{% break %}{% endmacro %}") == [
        "'{% break %}' outside a loop"]


def test_where_tags_may_stand() -> None:
    assert errors("{% for i in xs %}{% macro m() %}{% endmacro %}{% endfor %}") == [
        "a macro is defined only at the top level of a template"]
    assert errors("{% return 1 %}") == ["'{% return %}' outside a macro"]
    assert errors("{% try %}x{% endtry %}") == ["'{% try %}' without '{% except %}'"]
    assert errors("{% except %}") == ["'{% except %}' outside of a '{% try %}' block"]
    assert errors("{% try %}{% except %}{% except %}{% endtry %}") == [
        "a '{% try %}' block has one '{% except %}'"]
    assert errors("{% while x %}") == [
        "'{% while %}' at 1:1 is never closed (expected '{% endwhile %}')"]


def test_macro_definitions_are_checked() -> None:
    assert errors("{% macro f(a, a) %}{% endmacro %}") == ["parameter 'a' appears twice"]
    assert errors("{% macro f() %}{% endmacro %}{% macro f() %}{% endmacro %}") == [
        "macro 'f' is defined twice"]
    assert errors("{% macro calc() %}{% endmacro %}", CALC) == [
        "macro 'calc' has the name of a host function"]
    assert errors("{% macro _f() %}{% endmacro %}") == [
        "macro '_f': names may not start with '_' or contain '__'"]


def test_calls_are_checked_against_signatures() -> None:
    assert errors("{{ calc() }}{{ calc('1', '2') }}{{ pick(1, c=2) }}{{ pick(1, a=2) }}",
                  CALC) == [
        "calc() is missing argument 'expression'",
        "calc() takes 1 argument, got 2",
        "pick() has no argument 'c' (its arguments: a, b)",
        "pick() got argument 'a' twice"]
    assert errors("{{ 'x' | pick(1, 2) }}", CALC) == ["pick() takes 1 to 2 arguments, got 3"]
    assert errors("{% macro m(a) %}{% endmacro %}{{ m() }}") == [
        "m() is missing argument 'a'"]
    assert errors("{{ run_tool() }}", CALC) == ["run_tool() is missing argument 'call'"]
    # Without host functions run_tool and tools() could only fail or offer nothing.
    assert errors("{{ run_tool(c) }}{{ tools() }}") == [
        "run_tool() needs host functions, and none are registered",
        "tools() needs host functions, and none are registered"]


def test_an_unregistered_function_names_the_way_to_register_it() -> None:
    with pytest.raises(TemplateErrors) as info:
        compile_source("{{ calc('1+1') }}")
    assert "--functions FILE.py" in str(info.value)
    with pytest.raises(TemplateErrors, match="did you mean 'calc'"):
        compile_source("{{ calk('1+1') }}", functions=CALC)


def test_the_new_keywords_stay_names_elsewhere() -> None:
    program = compile_source("{{ x.while }}{{ d.return }}{% set try_count = 1 %}")
    assert program.inputs == ("x", "d")


def test_a_macro_does_not_see_the_templates_captures() -> None:
    assert errors("{{ gen name }}{% macro m() %}{{ name }}{% endmacro %}{{ m() }}") == [
        "macro 'm' cannot see the capture 'name'"]
    compile_source("{% macro m() %}{{ gen name }}{{ name }}{% endmacro %}{{ m() }}")
