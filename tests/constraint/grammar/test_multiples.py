"""Negative multiples listed beside `multipleOf` (qrun/constraint/grammar/multiples.py):
llguidance writes no minus sign for a `multipleOf` number; the rewrite gives back the few
negative multiples a bound allows, each valid by the `jsonschema` validator, and no other
value."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.constraint.grammar import rewrite
from qrun.constraint.grammar.multiples import negative_multiples
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher

_DRAFT4 = "http://json-schema.org/draft-04/schema#"

SCHEMAS: list[dict[str, Any]] = [
    {"type": "integer", "multipleOf": 16, "minimum": -2032, "maximum": 2031},
    {"type": "number", "multipleOf": 0.5, "minimum": -3},
    {"$schema": _DRAFT4, "type": "integer", "multipleOf": 16, "minimum": -64,
     "maximum": 64, "exclusiveMaximum": True},
    {"multipleOf": 3, "minimum": -10, "not": {"const": -6}},
]


def _validator(schema: Any) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


@pytest.mark.parametrize("schema", SCHEMAS, ids=[json.dumps(s)[:60] for s in SCHEMAS])
def test_the_rewrite_keeps_exactly_the_valid_values(schema: dict[str, Any]) -> None:
    out = rewrite(schema)
    assert "enum" in json.dumps(out)
    before, after = _validator(schema), _validator(out)

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.integers(-2100, 2100) | st.integers(-70, 70).map(lambda n: n / 2)
           | st.sampled_from(["x", None, [], {}]))
    def agree(value: Any) -> None:
        assert after.is_valid(value) == before.is_valid(value), (value, json.dumps(out))

    agree()


@pytest.mark.parametrize("schema", SCHEMAS[:3], ids=["integer", "half", "draft-04"])
def test_the_matcher_takes_the_negative_multiples(schema: dict[str, Any],
                                                  smol_vocab: Vocabulary) -> None:
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    for value in (-64, -48, -3, -1.5, -16, 0, 16, 48, -8, -2048, -3.5, 2.5, 64):
        matcher.reset()
        taken = matcher.consume_text(json.dumps(value)) and matcher.accepting()
        assert taken == _validator(schema).is_valid(value), value


@pytest.mark.parametrize("schema", [
    {"type": "integer", "multipleOf": 2},  # no lower bound: nothing to list
    {"type": "integer", "multipleOf": 2, "minimum": 0},
    {"type": "integer", "multipleOf": 1, "minimum": -1000},  # too many
    {"type": "integer", "multipleOf": 2, "minimum": -8, "maximum": -2},  # none non-negative
    {"type": "integer", "multipleOf": 2, "minimum": -8, "exclusiveMinimum": -8},
])
def test_what_it_leaves_alone(schema: dict[str, Any]) -> None:
    sub = dict(schema)
    assert negative_multiples(sub, lambda part: _validator(part)) is None and sub == schema
