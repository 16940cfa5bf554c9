"""JSON Schema -> regex: generated JSON (random walks on the real vocabulary) parses and
validates with `jsonschema`; integer ranges are exact; unsupported keywords name their path;
keys are forced bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qrun.backends.vocab import Vocabulary
from qrun.regex.dfa import compile_dfa
from qrun.runtime.masks import IndexCache, TokenIndex
from qrun.stdlib.json_schema import SchemaError, schema_to_regex

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "active": {"type": "boolean"},
        "score": {"type": ["number", "null"]},
    },
    "required": ["name", "age"],
}
SCHEMAS: list[dict[str, Any]] = [
    PERSON,
    {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {
            "start": {"$ref": "#/$defs/point"},
            "end": {"$ref": "#/$defs/point"},
            "label": {
                "anyOf": [{"type": "string", "pattern": "^[A-Z]{2}[0-9]$"}, {"type": "null"}]
            },
        },
        "required": ["start", "label"],
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 250},
        "minItems": 1,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "time"},
            "id": {"type": "string", "format": "uuid"},
            "price": {"type": "number", "minimum": 0, "maximum": 100},
            "kind": {"const": "order"},
            "note": {"type": "string", "maxLength": 6},
        },
        "required": ["when", "id", "price", "kind"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    },
]


def _validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


@pytest.mark.parametrize("schema_index", range(len(SCHEMAS)))
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(choices=st.lists(st.integers(0, 2**31), min_size=120, max_size=120))
def test_random_walks_are_valid_json(
    schema_index: int,
    choices: list[int],
    smol_indexes: IndexCache,
    smol_vocab: Vocabulary,
    random_walk: Callable[[TokenIndex, list[int], int], bytes],
) -> None:
    schema = SCHEMAS[schema_index]
    index = smol_indexes.get(schema_to_regex(schema), smol_vocab)
    text = random_walk(index, choices, 120).decode("utf-8")
    document = json.loads(text)
    _validator(schema).validate(document)


@pytest.mark.parametrize(
    ("schema", "document", "valid"),
    [
        (PERSON, {"name": "Jo", "age": 41}, True),
        (PERSON, {"name": "Jo", "age": 41, "active": True, "score": None}, True),
        (PERSON, {"name": 'Jo"\\\n\u00e9', "age": 0, "tags": ["a", "c"]}, True),
        (PERSON, {"name": "", "age": 41}, False),
        (PERSON, {"name": "Jo", "age": 121}, False),
        (PERSON, {"age": 41, "name": "Jo"}, False),  # schema order is fixed
        (PERSON, {"name": "Jo"}, False),
        (PERSON, {"name": "Jo", "age": 4, "tags": ["a", "b", "c", "a"]}, False),
        (SCHEMAS[2], [-5, 0, 250], True),
        (SCHEMAS[2], [], False),
        (SCHEMAS[2], [251], False),
        (
            SCHEMAS[3],
            {
                "when": "2024-01-31T12:00:00Z",
                "id": "123e4567-e89b-12d3-a456-426614174000",
                "price": 99.5,
                "kind": "order",
            },
            True,
        ),
        (
            SCHEMAS[3],
            {
                "when": "2024-01-31T12:00:00Z",
                "id": "123e4567-e89b-12d3-a456-426614174000",
                "price": 100.5,
                "kind": "order",
            },
            False,
        ),
        (SCHEMAS[4], {}, True),
        (SCHEMAS[4], {"b": "x", "c": False}, True),
    ],
)
def test_documents(schema: dict[str, Any], document: Any, valid: bool) -> None:
    text = json.dumps(document, ensure_ascii=False, separators=(", ", ": "))
    assert compile_dfa(schema_to_regex(schema)).matches(text.encode()) == valid


def test_integer_ranges_are_exact() -> None:
    bounds: list[dict[str, int]] = [
        {"minimum": 0, "maximum": 0},
        {"minimum": 3, "maximum": 17},
        {"minimum": -120, "maximum": -3},
        {"minimum": -5, "maximum": 1234},
        {"maximum": 5},
        {"minimum": 7},
        {"exclusiveMinimum": 9, "exclusiveMaximum": 100},
        {"maximum": -7},
        {"minimum": -3},
    ]
    for bound in bounds:
        dfa = compile_dfa(schema_to_regex({"type": "integer", **bound}))
        validator = _validator({"type": "integer", **bound})
        for n in range(-1500, 1500):
            assert dfa.matches(str(n).encode()) == validator.is_valid(n), (bound, n)
        assert not dfa.matches(b"-0") or validator.is_valid(0)


def test_forced_key_after_brace() -> None:
    dfa = compile_dfa(schema_to_regex(PERSON))
    assert dfa.forced_bytes(dfa.start) == b'{"name": "'
    after_name = dfa.step(dfa.start, b'{"name": "Jo"')
    assert dfa.forced_bytes(after_name) == b', "age": '


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            {"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 5}}},
            "'multipleOf' at #/properties/age/multipleOf",
        ),
        ({"type": "string", "format": "hostname"}, "format 'hostname' at #/format"),
        ({"type": "array"}, "needs 'items'"),
        ({"type": "object", "patternProperties": {}}, "'patternProperties' at #/patternProperties"),
        ({"oneOf": [{"type": "string"}]}, "'oneOf' at #/oneOf"),
        (
            {
                "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                "$ref": "#/$defs/n",
            },
            "recursive",
        ),
        ({"$ref": "#/$defs/missing"}, "does not resolve"),
        ({"type": "object", "properties": {"a/b": {"type": "thing"}}}, "#/properties/a~1b/type"),
        ({"type": "number", "minimum": -1}, "number bounds"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "leave no value"),
        ({"type": "string", "pattern": "a.b"}, "must be escaped"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreferences"),
        ({"type": "object", "properties": {}, "required": ["x"]}, "'x'"),
        ({}, "any JSON value"),
    ],
)
def test_schema_errors(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=message.replace("$", r"\$")):
        schema_to_regex(schema)


def test_string_escapes_and_pattern() -> None:
    string = compile_dfa(schema_to_regex({"type": "string"}))
    for ok in ['""', '"a\\"b"', '"\\u00e9\\n"', '"é😀"']:
        assert string.matches(ok.encode()), ok
    for bad in ['"a"b"', '"\\x"', '"\n"', '"\\u12"', '"\\"']:
        assert not string.matches(bad.encode()), bad
    unanchored = compile_dfa(schema_to_regex({"type": "string", "pattern": "[0-9]{3}"}))
    assert unanchored.matches(b'"ab123cd"') and not unanchored.matches(b'"12"')
