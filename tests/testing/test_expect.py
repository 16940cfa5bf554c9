"""Expectations (qrun/testing/expect.py): each kind passes on a result that shows it and fails
with what was found instead."""

from __future__ import annotations

from typing import Any

from hang import alarm

from qrun.testing import parse_cases


def _check(expect: str, text: str, values: dict[str, Any]) -> list[str | None]:
    (case,) = parse_cases(f"- name: c\n  expect:\n{expect}", "c.tests.yaml")
    return [e.check(text, values) for e in case.expectations]


def test_vars_compare_as_json_values() -> None:
    assert _check("    vars: {n: 25, p: {a: 1, b: [1, 2.0]}}\n", "",
                  {"n": 25.0, "p": {"b": [1, 2], "a": 1}}) == [None, None]
    failed = _check("    vars: {n: 25, flag: 1}\n", "", {"n": 24, "flag": True})
    assert failed == ["got 24", "got true"]
    assert _check("    vars: {missing: 1}\n", "", {}) == [
        "no capture or input named 'missing' in the result"]


def test_schema_names_the_first_error_and_its_place() -> None:
    schema = "    schema:\n      p: {type: object, properties: {age: {type: integer}}}\n"
    assert _check(schema, "", {"p": {"age": 3}}) == [None]
    (failure,) = _check(schema, "", {"p": {"age": "3"}})
    assert failure is not None and "is not of type 'integer'" in failure
    assert '(at ["age"])' in failure


def test_that_evaluates_a_qrun_expression_over_inputs_and_captures() -> None:
    expect = "    that: ['label in [\"a\", \"b\"]', 'n > 2 and text_in | length == 3']\n"
    assert _check(expect, "", {"label": "a", "n": 3, "text_in": "abc"}) == [None, None]
    failed = _check(expect, "", {"label": "c", "n": 1, "text_in": "abc"})
    assert failed == ['it is false where label = "c"', "it is false where n = 1, text_in = \"abc\""]
    (undefined,) = _check("    that: 'nope == 1'\n", "", {})
    assert undefined is not None and "undefined variable 'nope'" in undefined


def test_text_searches_the_result_text() -> None:
    expect = "    text: ['Total: [0-9]+', '^Paid']\n"
    assert _check(expect, "Paid.\nTotal: 12", {}) == [None, None]
    failed = _check(expect, "Total: none", {})
    assert failed[0] is not None and failed[0].startswith("not found in the text")


def test_a_catastrophic_pattern_fails_the_case_instead_of_hanging() -> None:
    with alarm(30):
        (failure,) = _check("    text: '(a|aa)+b'\n", "a" * 40, {})
    assert failure is not None and "longer than" in failure
