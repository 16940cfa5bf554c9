"""A draft-04 tuple (`"items": [{...}, {...}]`, what 2020-12 spells `prefixItems`) goes through
every path a schema takes: issue #24 reported it escaping as `AttributeError: 'list' object
has no attribute 'get'`. Not reproduced on 6cdf23b (nor on c020af2) through schema_positions,
close_objects (closed=true), rewrite, check_schema (with refusals located inside the tuple),
json_grammar and a compiled index; these tests keep every path handling it."""

from __future__ import annotations

from typing import Any

import pytest

from qrun.constraint.grammar import FIXED, FLEXIBLE, JsonFormat, check_schema, json_grammar, rewrite
from qrun.constraint.grammar.schema import close_objects, schema_positions
from qrun.constraint.grammar_index import LlgIndex
from qrun.constraint.vocab import Vocabulary

DRAFT4 = "http://json-schema.org/draft-04/schema#"
OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}}
TUPLE: dict[str, Any] = {"$schema": DRAFT4, "type": "array",
                         "items": [{"type": "string"}, OBJECT], "additionalItems": False}

SCHEMAS = {
    "tuple": TUPLE,
    "open tuple": {**TUPLE, "additionalItems": {"type": "integer"}},
    "nested": {"$schema": DRAFT4, "type": "object",
               "properties": {"t": {k: v for k, v in TUPLE.items() if k != "$schema"}}},
    "behind a $ref": {"$schema": DRAFT4, "definitions": {"t": {**TUPLE, "$schema": None}},
                      "$ref": "#/definitions/t"},
    "a $ref inside": {"$schema": DRAFT4, "definitions": {"o": OBJECT}, "type": "array",
                      "items": [{"type": "string"}, {"$ref": "#/definitions/o"}]},
    "in anyOf": {"$schema": DRAFT4, "anyOf": [TUPLE, {"type": "null"}]},
    "in allOf": {"$schema": DRAFT4, "allOf": [TUPLE, {"minItems": 1}]},
    "empty": {"$schema": DRAFT4, "type": "array", "items": []},
    "of booleans": {"$schema": DRAFT4, "type": "array", "items": [True, {"type": "null"}]},
}


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("fmt", [FIXED, FLEXIBLE, JsonFormat(closed=True)],
                         ids=["fixed", "flexible", "closed"])
def test_every_path_takes_a_tuple(name: str, fmt: JsonFormat) -> None:
    schema = SCHEMAS[name]
    schema = {k: v for k, v in schema.items() if v is not None}
    assert [p for p, _ in schema_positions(schema)]  # walks without raising
    rewrite(schema)
    close_objects(schema)
    assert check_schema(schema, fmt) is None
    assert json_grammar(schema, fmt).startswith("%llguidance")


def test_positions_walk_into_tuple_items_and_closed_closes_them() -> None:
    pointers = [p for p, _ in schema_positions(TUPLE)]
    assert pointers == ["", "/items/0", "/items/1", "/items/1/properties/a"]
    closed = close_objects(TUPLE)
    assert closed["items"][1]["additionalProperties"] is False
    assert "additionalProperties" not in TUPLE["items"][1]  # a copy


def test_a_refusal_inside_a_tuple_is_located_there() -> None:
    schema = {"$schema": DRAFT4, "type": "array",
              "items": [{"type": "string"}, {"type": "array", "uniqueItems": True}]}
    error = check_schema(schema)
    assert error is not None and error.pointer == "/items/1/uniqueItems"
    schema = {"$schema": DRAFT4, "type": "array", "items": [{"$ref": "#/definitions/none"}]}
    error = check_schema(schema)
    assert error is not None and error.pointer == "/items/0/$ref"


@pytest.mark.parametrize(("fmt", "text", "accepted"), [
    (FIXED, '["a", {"a": 1}]', True),
    (FIXED, '[{"a": 1}, "a"]', False),  # the positions hold
    (FIXED, '["a", {"a": 1}, 2]', False),  # additionalItems: false
    (FIXED, "[]", True),
    (JsonFormat(closed=True), '["a", {"a": 1, "b": 2}]', False),  # closed inside the tuple
    (FIXED, '["a", {"a": 1, "b": 2}]', True),
])
def test_the_grammar_asserts_the_tuple(byte_vocab: Vocabulary, fmt: JsonFormat, text: str,
                                       accepted: bool) -> None:
    index = LlgIndex(json_grammar(TUPLE, fmt), byte_vocab)
    assert index.accepts(text.encode()) is accepted
