"""Expectations (qrun/testing/expect.py): each kind passes on a result that shows it and fails
with what was found instead."""

from __future__ import annotations

from typing import Any

import pytest
from hang import alarm

from qrun.testing import CaseFileError, parse_cases


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


def test_a_catastrophic_schema_pattern_fails_the_case_instead_of_hanging() -> None:
    with alarm(30):
        (failure,) = _check("    schema: {v: {type: string, pattern: '^(a|aa)+b'}}\n", "",
                            {"v": "a" * 40})
    assert failure is not None and "took longer than" in failure
    # patternProperties too, and a plain pattern still judges
    with alarm(30):
        (failure,) = _check("    schema: {v: {patternProperties: {'(a|aa)+b': {}}}}\n", "",
                            {"v": {"a" * 40: 1}})
    assert failure is not None and "took longer than" in failure
    assert _check("    schema: {v: {pattern: '^[0-9]+$'}}\n", "", {"v": "12"}) == [None]
    (failure,) = _check("    schema: {v: {pattern: '^[0-9]+$'}}\n", "", {"v": "1x"})
    assert failure is not None and "does not match" in failure


@pytest.mark.parametrize("schema", ["{$ref: '#/definitions/nope'}",
                                    "{$ref: 'http://example.com/s.json'}"])
def test_a_schema_ref_must_point_inside_it(schema: str) -> None:
    with pytest.raises(CaseFileError, match="points nowhere in this schema"):
        parse_cases(f"- expect:\n    schema: {{v: {schema}}}\n")


@pytest.mark.parametrize("pattern, message", [
    ("(?:(?:(?:a{1000}){1000}){1000}){1000}", "multiply to at most"),
    ("a" * 1001, "at most 1,000 characters"),
])
def test_a_text_regex_too_costly_to_compile_is_refused(pattern: str, message: str) -> None:
    with alarm(30), pytest.raises(CaseFileError, match=message):
        parse_cases(f"- expect:\n    text: '{pattern}'\n")
