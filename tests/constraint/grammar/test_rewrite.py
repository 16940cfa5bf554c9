"""The sound rewrite of JSON Schemas (qrun/constraint/grammar/rewrite.py, finite.py,
negation.py, one_of.py): for each rewrite, a schema llguidance refuses as written, the values
it should take and refuse, and random values. Each rewritten schema accepts exactly the
values the original does (by the `jsonschema` validator, the reference), compiles, and a
`qrun.Matcher` on it takes the valid values' text and refuses the invalid ones'."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.constraint.grammar import FIXED, check_schema, rewrite, validate
from qrun.constraint.grammar.negation import negate
from qrun.constraint.grammar.text import HEADER
from qrun.constraint.vocab import Vocabulary
from qrun.matcher import Matcher

# A tree whose kids carry a `$ref` sibling (refs.py cases).
_NODE = {"type": "object", "properties": {"v": {"type": "string"}, "kids": {
    "type": "array", "items": {"$ref": "#/definitions/node", "maxProperties": 1}}}}
_DRAFT7 = "http://json-schema.org/draft-07/schema#"

# (name, schema, values: valid or not as the original says). Each schema is refused by
# llguidance as written (checked below).
CASES: list[tuple[str, dict[str, Any], list[Any]]] = [
    # finite.py: a finite list filtered by the rest of the subschema.
    ("allOf enum and not", {"allOf": [{"enum": [1, 2, 3, "a", 4.5]},
                                      {"not": {"type": "integer", "multipleOf": 2}}]},
     [1, 2, 3, 4, "a", 4.5, "b", None]),
    ("enum beside not pattern", {"enum": ["x1", "y1", "z1"], "not": {"pattern": "^y"}},
     ["x1", "y1", "z1", "x"]),
    ("enum of arrays, unique items", {"allOf": [{"enum": [[1, 2], [1, 1], [2], []]},
                                                {"uniqueItems": True}]},
     [[1, 2], [1, 1], [2], [], [2, 1]]),
    ("const of a $ref with an overlapping oneOf",
     {"$ref": "#/$defs/ab", "oneOf": [{"const": "a"}, {"enum": ["a", "c"]}],
      "$defs": {"ab": {"enum": ["a", "b", "c"]}}},
     ["a", "b", "c", "d"]),
    ("unique items from an enum", {"type": "array", "uniqueItems": True, "maxItems": 2,
                                   "items": {"enum": ["a", "b", "c"]}},
     [[], ["a"], ["a", "a"], ["b", "a"], ["a", "b", "c"], ["d"], "a"]),
    ("unique booleans", {"type": "array", "uniqueItems": True, "minItems": 1,
                         "items": {"type": "boolean"}},
     [[], [True], [True, False], [False, False], [None]]),
    ("a short integer range", {"type": "integer", "minimum": 0, "maximum": 9,
                               "not": {"multipleOf": 3}},
     [0, 1, 3, 8, 9, 10, -1, 2.5, "1"]),
    # negation.py: complements.
    # pattern_complement.py: the complement of a pattern of one character item.
    ("not only these characters", {"not": {"pattern": "^[.,*\\-\\s{}()]+$"}},
     ["", ".", "., *", "a", ".a", "-", "(x)", "{-}", 3, None]),
    ("not holding a dollar", {"type": "string", "not": {"pattern": "(\\$)"}},
     ["", "a", "$", "a$b", "ab", 1]),
    ("string not in an enum", {"type": "string", "not": {"enum": ["red", "green", "gr"]}},
     ["red", "green", "gr", "g", "", "greenish", "re", "blue", "r\u00e9d", 3]),
    # `\\` and `"` are where llguidance's negated classes let escapes through (negation.py).
    ("not of an enum of every type",
     {"not": {"enum": [1, 2.5, None, True, "a", "b\\.", 'q"', "\u00e9"]}},
     [0, 1, 1.0, 2, 2.5, 3, -1, False, True, None, "a", "b\\.", "b.", "b\\", 'q"', "q",
      "\u00e9", "e", "", [], {}]),
    ("double negation", {"not": {"not": {"minimum": 3}}}, [2, 3, 3.5, "x", None]),
    ("not anyOf of bounds", {"not": {"anyOf": [{"type": "string", "maxLength": 2},
                                               {"type": "number", "minimum": 10}]}},
     ["ab", "abc", "", 9, 10, 10.5, True, [], {}]),
    ("not of a property", {"type": "object", "not": {"properties": {"kind": {"const": "x"}},
                                                     "required": ["kind"]}},
     [{"kind": "x"}, {"kind": "y"}, {}, {"kind": "x", "n": 1}, {"n": 1}]),
    ("not of a $ref", {"not": {"$ref": "#/$defs/short"},
                       "$defs": {"short": {"maxLength": 3, "minItems": 1}}},
     ["abc", "abcd", [], [1], 5]),
    ("not of counts", {"type": "array", "not": {"minItems": 1, "maxItems": 2}},
     [[], [1], [1, 2], [1, 2, 3]]),
    # one_of.py: overlapping branches made disjoint.
    ("oneOf of required sets",
     {"type": "object", "properties": {"radius": {"type": "number"},
                                       "length": {"type": "number"},
                                       "width": {"type": "number"}},
      "oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]}]},
     [{"radius": 1}, {"length": 1, "width": 2}, {"radius": 1, "length": 1, "width": 2},
      {"radius": 1, "length": 1}, {}, {"length": 1}]),
    ("oneOf of overlapping ranges",
     {"oneOf": [{"type": "number", "maximum": 5}, {"type": "number", "minimum": 2}]},
     [1, 2, 3.5, 5, 6, "x"]),
    ("oneOf of closed objects",
     {"oneOf": [{"type": "object", "additionalProperties": False,
                 "properties": {"key": {"type": "string"}}},
                {"type": "object", "additionalProperties": False,
                 "properties": {"keys": {"type": "number", "minimum": 0}}}]},
     [{}, {"key": "a"}, {"keys": 1}, {"keys": -1}, {"key": "a", "keys": 1}, {"key": 1}]),
    ("oneOf of a constant and its type",
     {"oneOf": [{"const": "a"}, {"type": "string", "maxLength": 1}]},
     ["a", "b", "ab", ""]),
    # counts.py: property counts beside optional properties, on a closed object.
    ("property counts on a closed object",
     {"type": "object", "additionalProperties": False, "required": ["a"],
      "properties": {"a": {}, "b": {}, "c": {}, "d": {}}, "minProperties": 2,
      "maxProperties": 3},
     [{"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "d": 4}, {"a": 1, "b": 2, "c": 3, "d": 4},
      {"b": 2, "c": 3}, {"a": 1, "e": 5}]),
    # rewrite.py: if/then/else through the complement of `if`.
    ("if then else",
     {"type": "object", "properties": {"kind": {"type": "string"}, "n": {"type": "number"}},
      "if": {"properties": {"kind": {"const": "count"}}, "required": ["kind"]},
      "then": {"required": ["n"]}, "else": {"properties": {"n": {"maximum": 0}}}},
     [{"kind": "count", "n": 1}, {"kind": "count"}, {"kind": "x", "n": 1}, {"kind": "x"},
      {"n": -1}, {"n": 2}]),
    ("if then", {"if": {"type": "string"}, "then": {"maxLength": 2}},
     ["ab", "abc", 5, None]),
    # The rewrites rewrite.py had before: dependencies, `not required`.
    ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b", "c"]}},
     [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"b": 2}]),
    ("not required", {"type": "object", "not": {"required": ["secret"]},
                      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
     [{"a": 1}, {"a": 1, "secret": 2}, {"b": 1}, {"a": 1, "b": 2}]),
    # refs.py: the siblings of a circular `$ref` that say nothing there.
    # Draft-07 ignores the siblings of `$ref` (the `maxProperties` here).
    ("circular $ref with a sibling, draft-07",
     {"$schema": _DRAFT7, "definitions": {"node": _NODE}, "$ref": "#/definitions/node"},
     [{}, {"kids": [{"v": "a", "kids": []}]}, {"kids": [1]}, {"v": 1}, []]),
    ("circular $ref with an implied type, 2020-12",
     {"$defs": {"node": {"type": "object", "properties": {"kids": {
         "type": "array", "items": {"$ref": "#/$defs/node", "type": "object",
                                    "description": "a child"}}}}},
      "$ref": "#/$defs/node"},
     [{}, {"kids": [{}]}, {"kids": [{"kids": [{}]}]}, {"kids": [1]}, 1]),
    # property_names.py: the names as properties or patterns.
    ("propertyNames pattern",
     {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
      "properties": {"Ab": {"type": "number"}}, "additionalProperties": {"type": "integer"}},
     [{}, {"ab": 1}, {"ab": "s"}, {"Ab": 1}, {"a1": 1}, {"": 1}, []]),
    ("propertyNames lengths",
     {"type": "object", "propertyNames": {"minLength": 2, "maxLength": 3}},
     [{}, {"ab": 1}, {"abc": None}, {"a": 1}, {"abcd": 1}, {"a\nb": 1}]),
    ("propertyNames ref to a pattern beside a match-all pattern",
     {"type": "object", "propertyNames": {"$ref": "#/$defs/key"},
      "patternProperties": {".*": {"type": "number"}}, "additionalProperties": False,
      "$defs": {"key": {"type": "string", "pattern": "^k[0-9]$"}}},
     [{}, {"k1": 1}, {"k1": "s"}, {"k": 1}, {"xk1": 1}]),
    ("propertyNames enum",
     {"type": "object", "propertyNames": {"enum": ["a", "b", "c", "dd"], "maxLength": 1},
      "properties": {"a": {"type": "string"}, "z": {}},
      "patternProperties": {"^b": {"type": "integer"}},
      "additionalProperties": {"type": "boolean"}},
     [{}, {"a": "s"}, {"a": 1}, {"b": 1}, {"b": True}, {"c": True}, {"c": 1}, {"z": 1},
      {"dd": True}, {"bb": 1}]),
    # MaskBench Github_hard o12459: a name outside the list that a pattern takes.
    ("propertyNames enum beside a match-all pattern",
     {"type": "object", "propertyNames": {"enum": ["p10", "p50"]},
      "patternProperties": {".*": {"type": "number"}}, "additionalProperties": False},
     [{}, {"p10": 1}, {"p10": "s"}, {"p10": 1, "p50": 2}, {"invalid-pipette": 500},
      {"p10": 1, "x": 2}]),
    ("propertyNames false", {"type": "object", "propertyNames": False},
     [{}, {"a": 1}, [], "x"]),
    ("propertyNames that only says string",
     {"type": "object", "propertyNames": {"type": "string", "description": "any"},
      "additionalProperties": {"type": "integer"}},
     [{}, {"a": 1}, {"a": "s"}]),
]

_IDS = [name for name, _, _ in CASES]


def _validator(schema: Any) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=jsonschema.FormatChecker())


def _valid(schema: Any, value: Any) -> bool:
    return bool(_validator(schema).is_valid(value))


def _raw_reason(schema: dict[str, Any]) -> str | None:
    """llguidance's reason for refusing `schema` as written (no rewrite)."""
    body = json.dumps({**schema, "x-guidance": FIXED.options()})
    return validate(f"{HEADER}start: %json {body}\n")


@pytest.mark.parametrize(("name", "schema", "values"), CASES, ids=_IDS)
def test_each_rewrite_keeps_the_valid_values(name: str, schema: dict[str, Any],
                                             values: list[Any]) -> None:
    assert _raw_reason(schema) is not None, "llguidance takes it without the rewrite"
    assert check_schema(schema) is None
    out = rewrite(schema)
    verdicts = [_valid(schema, v) for v in values]
    assert True in verdicts and False in verdicts, "the values should test both ways"
    assert [_valid(out, v) for v in values] == verdicts, json.dumps(out)


def _json_values(names: list[str], scalars: list[Any]) -> st.SearchStrategy[Any]:
    leaves = (st.none() | st.booleans() | st.integers(-3, 12)
              | st.sampled_from([0.5, 2.5, 4.5, 10.5, -1.5]) | st.text("abgrxy1.", max_size=5)
              | st.sampled_from(scalars))
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(names), inner, max_size=3),
                        max_leaves=6)


def _data_of(schema: Any) -> tuple[list[str], list[Any]]:
    """Property names and scalar values a schema mentions (random values near its edges)."""
    names: list[str] = ["z"]
    scalars: list[Any] = [None]

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if key in ("properties", "dependentRequired"):
                    names.append(k)
                walk(v, k)
        elif isinstance(node, list):
            for item in node:
                if key in ("enum", "required") or not isinstance(item, dict | list):
                    scalars.append(item) if not isinstance(item, dict | list) else None
                    if key == "required" and isinstance(item, str):
                        names.append(item)
                walk(item, key)
        elif key in ("const", "minimum", "maximum"):
            scalars.append(node)

    walk(schema)
    return names, scalars


@pytest.mark.parametrize(("name", "schema", "values"), CASES, ids=_IDS)
def test_random_values_agree(name: str, schema: dict[str, Any], values: list[Any]) -> None:
    out = rewrite(schema)
    before, after = _validator(schema), _validator(out)

    @settings(max_examples=150, deadline=None, database=None)
    @given(_json_values(*_data_of(schema)))
    def agree(value: Any) -> None:
        assert after.is_valid(value) == before.is_valid(value), (value, json.dumps(out))

    agree()


@pytest.mark.parametrize(("name", "schema", "values"), CASES, ids=_IDS)
def test_the_matcher_takes_exactly_the_valid_values(name: str, schema: dict[str, Any],
                                                    values: list[Any],
                                                    smol_vocab: Vocabulary) -> None:
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    for value in values:
        matcher.reset()
        # Non-ASCII as itself: llguidance 1.7 takes no `\u00e9` escape of it in a string.
        taken = matcher.consume_text(json.dumps(value, ensure_ascii=False)) and \
            matcher.accepting()
        assert taken == _valid(schema, value), value


def test_every_negation_is_the_complement() -> None:
    # Forms negate() has; each is checked against values of every type.
    forms: list[Any] = [
        True, False, {}, {"type": ["string", "null"]}, {"enum": ["a", 1, None]},
        {"const": False}, {"minimum": 2}, {"exclusiveMaximum": 2}, {"maxLength": 0},
        {"minLength": 1}, {"minProperties": 1}, {"maxItems": 1},
        {"required": ["a", "b"]}, {"type": "object", "required": ["a"]},
        {"properties": {"a": {"type": "string"}}, "required": ["a"], "type": "object"},
        {"allOf": [{"minimum": 1}, {"maximum": 3}]}, {"not": {"enum": ["x"]}},
    ]
    values: list[Any] = [None, True, False, 0, 1, 2, 2.5, 3, 4, "", "a", "x", "ab", [], [1],
                         [1, 2], {}, {"a": 1}, {"a": "s"}, {"a": 1, "b": 2}, {"b": 1}]
    for form in forms:
        complement = negate(form)
        assert complement is not None, form
        for value in values:
            assert _valid(complement, value) != _valid(form, value), (form, value)


def test_forms_without_a_complement_are_left_alone() -> None:
    for form in ({"pattern": "^a"}, {"multipleOf": 2}, {"type": "integer"},
                 {"items": {"type": "string"}}, {"enum": [[1]]},
                 {"properties": {"a": {}}, "additionalProperties": False},
                 {"$ref": "#/$defs/a"}):
        assert negate(form) is None, form


@pytest.mark.parametrize(("schema", "pointer", "words"), [
    ({"type": "string", "not": {"pattern": "^a"}}, "/not", "not"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "/uniqueItems",
     "uniqueItems"),
    # Patterns of two characters: no complement form (pattern_complement.py).
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "string", "pattern": "ab"},
                                                        {"type": "string", "pattern": "cd"}]}}},
     "/properties/a/oneOf", "oneOf"),
])
def test_what_stays_refused_says_why_and_where(schema: dict[str, Any], pointer: str,
                                               words: str) -> None:
    error = check_schema(schema)
    assert error is not None
    assert error.pointer == pointer and words in error.reason, error


def test_a_not_a_ref_points_into_stays_as_written() -> None:
    schema = {"$defs": {"x": {"not": {"type": "string"}}},
              "properties": {"a": {"$ref": "#/$defs/x/not"}}}
    assert rewrite(schema)["$defs"]["x"] == {"not": {"type": "string"}}
    plain = {"$defs": {"x": {"not": {"type": "string"}}},
             "properties": {"a": {"$ref": "#/$defs/x"}}}
    assert "not" not in rewrite(plain)["$defs"]["x"]


def test_the_input_schema_is_not_changed() -> None:
    schema = {"allOf": [{"enum": [1, 2]}, {"not": {"const": 1}}]}
    copy = json.loads(json.dumps(schema))
    assert rewrite(schema) == {"enum": [2]}
    assert schema == copy


def test_a_refusal_with_several_culprits_still_names_one() -> None:
    # Two `not`s without a complement: removing either alone leaves the other's refusal, so
    # the locator halves the list of candidates instead.
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "not": {"pattern": "^x"}},
        "b": {"type": "string", "not": {"pattern": "^y"}}}}
    error = check_schema(schema)
    assert error is not None and 'Unimplemented keys: ["not"]' in error.reason
    assert error.pointer in ("/properties/a/not", "/properties/b/not")


def test_a_oneof_made_anyof_keeps_its_place(smol_vocab: Vocabulary) -> None:
    # llguidance lays out properties in the order it meets the keywords: an `anyOf` moved
    # after `properties` made it refuse `{"kind": ..., "body": ...}` (MaskBench o85188).
    kind = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}
    schema = {"type": "object",
              "oneOf": [{"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
                        {"properties": {"kind": {"const": "b"}}, "required": ["kind"]}],
              "required": ["body"], "properties": {"body": {"type": "string"}}}
    assert list(rewrite(schema)) == ["type", "anyOf", "required", "properties"]
    assert list(rewrite({**schema, "anyOf": [kind]})) == [
        "type", "allOf", "required", "properties", "anyOf"]
    matcher = Matcher(SimpleNamespace(vocabulary=smol_vocab), json=schema)
    assert matcher.consume_text('{"kind": "a", "body": "x"}') and matcher.accepting()


def test_a_list_of_types_is_no_finite_list() -> None:
    schema = {"type": ["boolean", "string"], "not": {"const": True}}
    assert rewrite(schema)["type"] == ["boolean", "string"]
    assert check_schema(schema) is None


def test_min_properties_on_an_open_object_keeps_a_subset() -> None:
    # Unlisted keys count too, which no form here can: the listed ones stand for them.
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1}
    out = rewrite(schema)
    assert check_schema(schema) is None and _raw_reason(schema) is not None
    for value in [{}, {"a": 1}, {"b": 1, "x": 2}, {"x": 1}, {"x": 1, "y": 2}, []]:
        assert not _valid(out, value) or _valid(schema, value), value
    assert _valid(schema, {"x": 1}) and not _valid(out, {"x": 1})  # the values left out
    # maxProperties on an open object stays as written (extra keys are unbounded).
    error = check_schema({"type": "object", "properties": {"a": {}}, "maxProperties": 1})
    assert error is not None and error.pointer == "/maxProperties"


def test_if_is_no_keyword_before_draft_07() -> None:
    schema = {"$schema": "http://json-schema.org/draft-06/schema#",
              "if": {"type": "string"}, "then": {"maxLength": 2}}
    assert "if" in rewrite(schema)


@pytest.mark.parametrize("schema", [
    # 2020-12 applies a `$ref`'s siblings: one the target does not imply stays.
    {"$defs": {"node": {"type": "object", "properties": {"kids": {
        "type": "array", "items": {"$ref": "#/$defs/node", "maxProperties": 1}}}}},
     "$ref": "#/$defs/node"},
    # A pattern beside other patternProperties, a listed property the pattern would match,
    # a name schema with `not`.
    {"type": "object", "propertyNames": {"pattern": "^a"},
     "patternProperties": {"^ab": {"type": "string"}}},
    {"type": "object", "propertyNames": {"pattern": "^a"}, "properties": {"ab": {}},
     "additionalProperties": {"type": "string"}},
    {"type": "object", "propertyNames": {"not": {"enum": ["x"]}}},
], ids=["2020 sibling", "other patterns", "listed and matched", "not"])
def test_what_refs_and_property_names_leave_stays_refused(schema: dict[str, Any]) -> None:
    assert check_schema(schema) is not None
    out = rewrite(schema)
    for value in [{}, {"a": 1}, {"ab": "s"}, {"x": 1}, {"kids": [{"kids": []}]}]:
        assert _valid(out, value) == _valid(schema, value), value


def test_property_names_a_ref_points_into_stay_as_written() -> None:
    schema = {"type": "object", "propertyNames": {"pattern": "^a"},
              "additionalProperties": {"type": "string"},
              "properties": {"b": {"$ref": "#/additionalProperties"}}}
    assert rewrite(schema)["propertyNames"] == {"pattern": "^a"}
    del schema["properties"]
    assert "propertyNames" not in rewrite(schema)
