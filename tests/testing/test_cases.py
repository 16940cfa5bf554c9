"""Case files (qrun/testing/cases.py): what they hold, and every mistake reported at its line
and column, before any model work."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrun.testing import CaseFileError, load_cases, parse_cases
from qrun.testing.cases import MAX_CASE_FILE_BYTES

GOOD = """\
- name: first
  inputs: {review: "Great"}
  expect:
    vars: {sentiment: positive}
- inputs: {review: "Bad"}
  seed: 3
  temperature: 0.7
  expect:
    that: [sentiment != "positive", "review | length > 1"]
    text: 'The review is'
    schema:
      sentiment: {enum: [negative, mixed]}
"""


def test_a_case_file_reads_as_cases_with_their_places() -> None:
    first, second = parse_cases(GOOD, "t.tests.yaml")
    assert (first.name, first.inputs, first.seed, first.temperature) == (
        "first", {"review": "Great"}, None, None)
    assert str(first.where) == "t.tests.yaml:1:3"
    assert second.name == "case 2" and second.seed == 3 and second.temperature == 0.7
    kinds = [(e.kind, e.subject) for e in second.expectations]
    assert kinds == [("that", None), ("that", None), ("text", None), ("schema", "sentiment")]
    assert str(second.expectations[1].where) == "t.tests.yaml:9:37"
    assert str(second.expectations[3].where) == "t.tests.yaml:12:18"


def test_tests_key_and_empty_file() -> None:
    nested = "tests:\n" + "".join(f"  {line}\n" for line in GOOD.splitlines())
    assert [c.name for c in parse_cases(nested)] == ["first", "case 2"]
    assert parse_cases("# nothing yet\n") == []


@pytest.mark.parametrize("text, message, place", [
    ("- name: a\n  inputs: {x: 1}\n", "has no `expect`", "1:3"),
    ("- name: a\n  expect: {vars: {x: 1}}\n  bogus: 1\n", "unknown key 'bogus'", "3:10"),
    ("- name: a\n  expect: {vars: {x: 1}, maybe: 2}\n", "unknown expectation 'maybe'", "2:33"),
    ("- name: a\n  expect:\n    that: 'x ==== 1'\n", "that: unexpected", "3:11"),
    ("- name: a\n  expect:\n    that: 'a }} {{ b'\n", "not one expression", "3:11"),
    ("- name: a\n  expect:\n    text: '(unclosed'\n", "not a valid regex", "3:11"),
    ("- name: a\n  expect:\n    schema: {x: {type: 12}}\n", "not a valid JSON Schema",
     "3:17"),
    ("- name: a\n  seed: -1\n  expect: {that: 'true'}\n", "seed is a whole number", "2:9"),
    ("- name: a\n  temperature: hot\n  expect: {that: 'true'}\n", "temperature is a number",
     "2:16"),
    ("- name: a\n  inputs: [1, 2]\n  expect: {that: 'true'}\n", "inputs is a mapping", "2:11"),
    ("- name: a\n  expect: {that: 'true'}\n- name: a\n  expect: {that: 'true'}\n",
     "two cases are named 'a'", "3:3"),
    ("- name: 'a: b'\n  expect: {that: 'true'}\n", "a case's name", "1:9"),
    ("name: a\n", "tests are a list of cases", "1:1"),
    ("- name: a\n  expect: [1\n", "not valid YAML", "3:1"),
    ("- &x {name: a, expect: {that: 'true'}}\n- *x\n", "anchors and aliases", "1:3"),
    ("- name: a\n  expect: {that: !!python/object:os.system 'echo'}\n", "YAML tags", "2:18"),
    ("- name: a\n  seed: 3\n  expect: {that: 'true'}\n", "seed goes with temperature",
     "2:9"),
    ('- name: "a\\x01b"\n  expect: {that: "true"}\n', "a case's name", "1:9"),
    ("- name: a\n  inputs: {x: " + "[" * 40 + "]" * 40 + "}\n  expect: {that: 'true'}\n",
     "nests at most 32 levels", "2:44"),
    ("- name: a\n  expect:\n    that: 'x.__class__'\n", "starting with '_'", "3:11"),
])
def test_mistakes_are_reported_where_they_are(text: str, message: str, place: str) -> None:
    with pytest.raises(CaseFileError) as caught:
        parse_cases(text, "t.tests.yaml")
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"t.tests.yaml:{place}: "), str(caught.value)


def test_a_billion_laughs_is_refused_before_it_expands() -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]"
              for i in range(8)]
    with pytest.raises(CaseFileError, match="anchors and aliases"):
        parse_cases("\n".join(lines) + "\n", "bomb.tests.yaml")


def test_a_file_too_large_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.tests.yaml"
    path.write_text("#" * (MAX_CASE_FILE_BYTES + 1))
    with pytest.raises(CaseFileError, match="more than the"):
        load_cases(path)
    with pytest.raises(CaseFileError, match="cannot read it"):
        load_cases(tmp_path / "missing.tests.yaml")


def test_case_values_are_yaml_1_2_json_types() -> None:
    case, = parse_cases("- inputs: {a: yes, b: 0123, c: '1:30', d: 1:30, e: .nan, f: 1e3, "
                        "g: true}\n  expect: {text: x}\n")
    assert case.inputs == {"a": "yes", "b": "0123", "c": "1:30", "d": "1:30", "e": ".nan",
                           "f": 1000.0, "g": True}


def test_aliases_stay_refused_with_the_json_loader() -> None:
    with pytest.raises(CaseFileError, match="anchors and aliases"):
        parse_cases("- inputs: &a {x: 1}\n- inputs: *a\n")
