"""The schemas of typed front matter checked without jsonschema (qrun/lang/simple_schema.py):
every verdict agrees with jsonschema's (the reference validator), messages included, and a
typed template compiles without importing jsonschema (whose import alone can take 0.9 s)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from qrun.lang.simple_schema import is_simple, schema_problem, value_problem

OBJECT = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name"], "additionalProperties": False}
CASES: list[tuple[dict[str, Any] | bool, Any]] = [
    ({"type": "string"}, "x"), ({"type": "string"}, 3), ({"type": "integer"}, 3.0),
    ({"type": "integer"}, 3.5), ({"type": "integer"}, True), ({"type": "number"}, False),
    ({"type": ["string", "null"]}, None), ({"type": ["string", "null"]}, 1),
    ({"type": "array", "items": {"type": "string"}}, ["a", "b"]),
    ({"type": "array", "items": {"type": "string"}}, ["a", 2]),
    ({"type": "object", "additionalProperties": {"type": "number"}}, {"a": 1, "b": "x"}),
    ({"enum": ["a", 1]}, "a"), ({"enum": ["a", 1]}, 1.0), ({"enum": ["a", 1]}, True),
    ({"const": 2}, 2), ({"const": 2}, 3), ({"type": "integer", "maximum": 5}, 6),
    ({"type": "number", "exclusiveMinimum": 0}, 0), ({"type": "string", "maxLength": 2}, "abc"),
    ({"type": "string", "pattern": "^[a-z]+$"}, "abc"), ({"type": "string", "pattern": "^[a-z]+$"},
                                                        "ABC"),
    ({"type": "array", "minItems": 1}, []), (OBJECT, {"name": "a", "age": 3}),
    (OBJECT, {"age": 3}), (OBJECT, {"name": "a", "x": 1}), (OBJECT, {"name": "", "age": 1}),
    (OBJECT, {"name": "a", "age": -1}), (True, 1), (False, 1),
]


@pytest.mark.parametrize(("schema", "value"), CASES)
def test_verdicts_and_messages_agree_with_jsonschema(schema: Any, value: Any) -> None:
    assert is_simple(schema)
    assert schema_problem(schema) is None
    reference = best_match(Draft202012Validator(schema).iter_errors(value))
    ours = value_problem(schema, value)
    assert (ours is None) is (reference is None), (ours, reference)
    if ours is not None and reference is not None:
        assert ours[0] == tuple(reference.absolute_path)
        if not any(key in str(schema) for key in ("Length", "Items")):
            assert ours[1] == reference.message


@pytest.mark.parametrize(("schema", "path"), [
    ({"type": "strin"}, ("type",)), ({"minimum": "low"}, ("minimum",)),
    ({"required": "a"}, ("required",)), ({"items": {"type": 3}}, ("items", "type")),
    ({"properties": {"a": {"maxLength": -1}}}, ("properties", "a", "maxLength")),
    ({"pattern": "("}, ("pattern",)),
])
def test_invalid_simple_schemas_are_refused_as_jsonschema_does(schema: dict[str, Any],
                                                               path: tuple[str, ...]) -> None:
    assert is_simple(schema)
    problem = schema_problem(schema)
    assert problem is not None and problem[0] == path
    with pytest.raises(SchemaError):
        Draft202012Validator.check_schema(schema)


def test_other_keywords_are_not_simple() -> None:
    assert not is_simple({"type": "string", "format": "email"})
    assert not is_simple({"anyOf": [{"type": "string"}]})
    assert not is_simple({"items": {"$ref": "#/x"}})


def test_a_typed_template_compiles_without_importing_jsonschema() -> None:
    code = ("import sys\nfrom qrun.lang import compile_source\n"
            "compile_source('---\\ninputs:\\n  n: integer = 3\\n  t: list[string]?\\n"
            "  u: {type: object, properties: {a: {type: string}}}\\noutput:\\n  m: enum[a, b]\\n"
            "---\\n{{ n }}{{ select m options=[\"a\", \"b\"] }}')\n"
            "assert 'jsonschema' not in sys.modules, 'jsonschema was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
