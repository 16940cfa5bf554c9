"""Repeated pattern strings written once (qrun/constraint/grammar/shared_strings.py, the last
step of rewrite.py): the grammar llguidance gets holds each repeated pattern once, the
rewritten schema takes exactly the instances the original does (by `jsonschema`), and a
`qrun.Matcher` on it takes exactly the valid ones' text."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from qrun.constraint.grammar import FLEXIBLE, rewrite, schema_grammar
from qrun.constraint.grammar.formats import FORMATS
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher

_STAMP = {"type": "string", "format": "date-time"}
_CODE = {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}
_EVENT = {
    "type": "object",
    "properties": {
        "start": {**_STAMP, "description": "prose is dropped first, so these are equal"},
        "end": dict(_STAMP),
        "code": dict(_CODE),
        "codes": {"type": "array", "items": dict(_CODE)},
        "spare": {"anyOf": [dict(_CODE), {"type": "integer"}]},
        "note": {"type": ["string", "null"], "format": "date"},
        "memo": {"type": ["string", "null"], "format": "date"},
    },
    "required": ["start", "code"],
    "additionalProperties": False,
}
_VALUES: list[Any] = [
    {"start": "2024-02-29T10:00:00Z", "code": "ABC-12"},
    {"start": "2023-02-29T10:00:00Z", "code": "ABC-12"},  # not a leap year
    {"start": "2024-01-01T00:00:00Z", "end": "2024-01-01T01:00:00+01:00", "code": "XYZ-99",
     "codes": ["ABC-12", "DEF-34"], "spare": 7, "note": None, "memo": "2020-12-31"},
    {"start": "2024-01-01T00:00:00Z", "code": "XYZ-99", "codes": ["ABC-1"]},
    {"start": "2024-01-01T00:00:00Z", "code": "XYZ-99", "spare": "abc-12"},
    {"start": "2024-01-01T00:00:00Z", "code": "XYZ-99", "memo": "2020-13-01"},
    {"start": "2024-01-01T00:00:00Z", "end": "yesterday", "code": "ABC-12"},
]


def _valid(schema: Any, value: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return bool(cls(schema, format_checker=jsonschema.FormatChecker()).is_valid(value))


def _shared(schema: dict[str, Any]) -> dict[str, Any]:
    return {name: sub for name, sub in schema.get("$defs", {}).items()
            if name.startswith("qrun-shared-")}


def test_each_repeated_pattern_string_is_written_once() -> None:
    out = rewrite(_EVENT, formats="known")
    shared = _shared(out)
    assert len(shared) == 3  # the date-time, the code, the nullable date
    properties = out["properties"]
    for name in ("start", "end", "code", "note", "memo"):
        assert set(properties[name]) == {"$ref"}, name
    assert properties["codes"]["items"] == properties["code"]
    assert properties["spare"]["anyOf"][0] == properties["code"]
    grammar = schema_grammar(_EVENT, FLEXIBLE)
    assert grammar.count(json.dumps(_CODE["pattern"])) == 1
    date_time = FORMATS["date-time"].pattern
    assert date_time is not None and grammar.count(json.dumps(date_time)) == 1


def test_the_instances_stay_the_same() -> None:
    out = rewrite(_EVENT, formats="known")
    verdicts = [_valid(_EVENT, value) for value in _VALUES]
    assert True in verdicts and False in verdicts
    assert [_valid(out, value) for value in _VALUES] == verdicts, json.dumps(out)


def test_the_matcher_takes_exactly_the_valid_values(smol_vocab: Vocabulary) -> None:
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=_EVENT, formats="known")
    for value in _VALUES:
        matcher.reset()
        taken = matcher.consume_text(json.dumps(value)) and matcher.accepting()
        assert taken == _valid(_EVENT, value), value


def test_a_draft_04_document_shares_through_dollar_defs(smol_vocab: Vocabulary) -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
              "items": [dict(_CODE), dict(_CODE)], "definitions": {"c": dict(_CODE)}}
    out = rewrite(schema)
    assert len(_shared(out)) == 1 and out["definitions"]["c"] == out["items"][0]
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    for value in (["ABC-12", "DEF-34"], ["ABC-12", "abc"], ["ABC-12"]):
        matcher.reset()
        taken = matcher.consume_text(json.dumps(value)) and matcher.accepting()
        assert taken == _valid(schema, value), value


@pytest.mark.parametrize("schema", [
    # llguidance proves oneOf branches disjoint only when it sees them (a oneOf a `$ref`
    # points into stays a oneOf; rewrite.py makes the others anyOfs).
    {"properties": {"x": {"$ref": "#/properties/y/oneOf/1"}, "y": {"oneOf": [
        dict(_CODE), {"type": "object", "properties": {"c": dict(_CODE)}}]}}},
    {"allOf": [{"properties": {"a": dict(_CODE)}}, {"properties": {"b": dict(_CODE)}}]},
    {"not": {"properties": {"a": dict(_CODE), "b": dict(_CODE)}}},
    # An `$id` below the root changes the base a `$ref` resolves against.
    {"properties": {"a": dict(_CODE), "b": {"$id": "http://example.com/b", "properties": {
        "c": dict(_CODE)}}}},
    # Once: nothing to share.
    {"properties": {"a": dict(_CODE), "b": {**_CODE, "maxLength": 6}}},
], ids=["oneOf", "allOf", "not", "nested $id", "unequal"])
def test_where_a_ref_is_not_plainly_its_target_nothing_moves(schema: dict[str, Any]) -> None:
    assert _shared(rewrite(schema)) == {}


def test_a_taken_name_is_not_overwritten() -> None:
    schema = {"properties": {"a": dict(_CODE), "b": dict(_CODE),
                             "c": {"$ref": "#/$defs/qrun-shared-0"}},
              "$defs": {"qrun-shared-0": {"type": "integer"}}}
    out = rewrite(schema)
    assert out["$defs"]["qrun-shared-0"] == {"type": "integer"}
    assert out["properties"]["a"] == {"$ref": "#/$defs/qrun-shared-1"}
    assert out["$defs"]["qrun-shared-1"] == _CODE
