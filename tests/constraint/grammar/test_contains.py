"""`contains` rewritten as the positions its first match may take
(qrun/constraint/grammar/contains.py): the rewritten schema compiles, accepts only arrays the
`jsonschema` validator accepts under the original, and all of those whose first match
stands in the first positions."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.constraint.grammar import FIXED, check_schema, rewrite, validate
from qrun.constraint.grammar.contains import contains_positions
from qrun.constraint.grammar.text import HEADER
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher

_DRAFT7 = "http://json-schema.org/draft-07/schema#"
_DRAFT4 = "http://json-schema.org/draft-04/schema#"
_FIVE = {"type": "integer", "minimum": 5}

SCHEMAS: list[dict[str, Any]] = [
    {"type": "array", "contains": {"type": "number", "multipleOf": 11, "minimum": 100}},
    {"type": "array", "items": {"type": "integer"}, "contains": _FIVE},
    {"$schema": _DRAFT7, "type": "array", "items": {"type": "integer"}, "contains": _FIVE},
    {"items": {"enum": ["a", "b", 7]}, "contains": {"const": "b"}, "maxItems": 12},
]


def _validator(schema: Any) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def _first_match(schema: dict[str, Any], value: list[Any]) -> int | None:
    matching = _validator({**schema, **schema["contains"]})
    return next((i for i, item in enumerate(value) if matching.is_valid(item)), None)


@pytest.mark.parametrize("schema", SCHEMAS, ids=[json.dumps(s)[:60] for s in SCHEMAS])
def test_the_rewrite_compiles_and_keeps_a_subset(schema: dict[str, Any]) -> None:
    body = json.dumps({**schema, "x-guidance": FIXED.options()})
    raw = validate(f"{HEADER}start: %json {body}\n")
    assert raw is not None and "contains" in raw  # llguidance refuses it as written
    assert check_schema(schema) is None
    out = rewrite(schema)
    before, after = _validator(schema), _validator(out)

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.lists(st.sampled_from([0, 5, 7, 110, 121, 12.5, "a", "b", None]), max_size=11)
           | st.sampled_from([{}, "x", 3]))
    def subset(value: Any) -> None:
        if after.is_valid(value):
            assert before.is_valid(value), (value, json.dumps(out))
        elif before.is_valid(value):  # only an array whose first match comes late is lost
            assert isinstance(value, list)
            first = _first_match(schema, value)
            assert first is not None and first >= 8, (value, json.dumps(out))

    subset()


def test_the_matcher_takes_a_match_among_the_first_positions(smol_vocab: Vocabulary) -> None:
    schema = SCHEMAS[2]
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    for value, taken in [([5], True), ([1, 9, 3], True), ([0] * 7 + [6], True), ([1, 2], False),
                         ([], False), ([1, "a", 5], False), ([0] * 8 + [6], False)]:
        assert _validator(schema).is_valid(value) or not taken
        matcher.reset()
        assert (matcher.consume_text(json.dumps(value)) and matcher.accepting()) == taken, value


def test_what_says_nothing_is_dropped() -> None:
    # Before draft-06 `contains` is no keyword; `minContains: 0` asks for no match.
    for schema in ({"$schema": _DRAFT4, "type": "array", "contains": {"const": 1}},
                   {"type": "array", "contains": {"const": 1}, "minContains": 0}):
        out = rewrite(schema)
        assert "contains" not in json.dumps(out) and check_schema(schema) is None
        for value in ([], [2], [1]):
            assert _validator(out).is_valid(value) == _validator(schema).is_valid(value)


@pytest.mark.parametrize("schema", [
    {"type": "array", "contains": {"const": 1}, "maxContains": 2},
    {"type": "array", "contains": {"const": 1}, "minContains": 2},
    {"type": "array", "prefixItems": [{"const": 0}], "contains": {"const": 1}},
    {"$schema": _DRAFT7, "type": "array", "items": [{"const": 0}], "contains": {"const": 1}},
])
def test_counts_and_tuples_stay_refused(schema: dict[str, Any]) -> None:
    assert contains_positions(dict(schema), 2020 if "$schema" not in schema else 7) is None
    error = check_schema(schema)
    assert error is not None and error.pointer is not None and "contains" in error.pointer
