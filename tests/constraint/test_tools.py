"""qrun/constraint/tools.py: reading a list of tools in OpenAI's function format (every refusal
with its JSON pointer), the call schema (one closed object per tool, `$ref`s moved into their
branch, the keys in the caller's names and order) and its lowering (`lower("tools", ...)`,
spec.py), checked against the `jsonschema` validator."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from qrun.constraint import JsonFormat, LoweringError, lower
from qrun.constraint.tools import CallKeys, ToolsError, call_schema, read_tools

SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}}
# The inner form, without `type` in its parameters, and a $ref into its own $defs.
CALC = {"name": "calc", "parameters": {
    "$defs": {"expr": {"type": "string", "maxLength": 30}},
    "properties": {"expression": {"$ref": "#/$defs/expr"}}, "required": ["expression"]}}


def test_both_forms_read_alike() -> None:
    search, calc = read_tools([SEARCH, CALC])
    assert (search.name, search.description, search.pointer) == (
        "search", "Search the web", "/0/function/parameters")
    assert (calc.name, calc.description, calc.pointer) == ("calc", "", "/1/parameters")
    assert calc.parameters["type"] == "object"  # added: the arguments are an object
    (bare,) = read_tools([{"name": "now"}])
    assert bare.parameters["properties"] == {}  # no parameters: the arguments are {}


@pytest.mark.parametrize(("tools", "message", "pointer"), [
    ([], "non-empty list", ""),
    ({"name": "a"}, "non-empty list", ""),
    (["search"], "a tool is an object", "/0"),
    ([{"type": "retrieval"}], '"type" is "function"', "/0/type"),
    ([{"type": "function", "function": "f"}], '"function" is an object', "/0/function"),
    ([{"name": "a b"}], "1 to 64 letters", "/0/name"),
    ([{"name": "x" * 65}], "1 to 64 letters", "/0/name"),
    ([{"description": "no name"}], "1 to 64 letters", "/0/name"),
    ([{"name": "a", "description": 3}], "description is a string", "/0/description"),
    ([{"name": "a", "parameters": []}], "JSON Schema object", "/0/parameters"),
    ([{"name": "a", "parameters": {"type": "array"}}], "describe an object",
     "/0/parameters/type"),
    ([{"name": "a"}, SEARCH, {"name": "a"}], 'name "a" repeats (first at /0/name)', "/2/name"),
])
def test_bad_tools_are_refused_with_a_pointer(tools: Any, message: str, pointer: str) -> None:
    with pytest.raises(ToolsError) as caught:
        read_tools(tools)
    assert message in caught.value.message
    assert caught.value.pointer == pointer


def test_the_call_schema_accepts_exactly_the_calls() -> None:
    schema = call_schema(read_tools([SEARCH, CALC]))
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"name": "search", "arguments": {"query": "x"}})
    assert validator.is_valid({"name": "calc", "arguments": {"expression": "1+1"}})
    assert not validator.is_valid({"name": "calc", "arguments": {"query": "x"}})
    assert not validator.is_valid({"name": "calc", "arguments": {"expression": "9" * 31}})
    assert not validator.is_valid({"name": "other", "arguments": {}})
    assert not validator.is_valid({"name": "search", "arguments": {"query": "x"}, "id": 1})
    branch = schema["anyOf"][1]
    assert list(branch["properties"]) == ["name", "arguments"]
    assert branch["properties"]["arguments"]["properties"]["expression"]["$ref"] == \
        "#/anyOf/1/properties/arguments/$defs/expr"


def test_the_keys_follow_the_caller() -> None:
    keys = CallKeys("function", "parameters", name_first=False)
    schema = call_schema(read_tools([SEARCH]), keys)
    assert list(schema["anyOf"][0]["properties"]) == ["parameters", "function"]
    assert jsonschema.Draft202012Validator(schema).is_valid(
        {"parameters": {"query": "q"}, "function": "search"})


def test_lowering_describes_the_tools_and_locates_refusals() -> None:
    spec = lower("tools", [SEARCH, CALC])
    assert spec.description == 'tools=["search", "calc"]'
    assert spec.value_type == "json"
    bad = {"name": "tag", "parameters": {"properties": {
        "tags": {"type": "array", "uniqueItems": True}}}}
    with pytest.raises(LoweringError) as caught:
        lower("tools", [SEARCH, bad])
    assert caught.value.message.startswith('tool "tag": JSON Schema: Unimplemented keys')
    assert caught.value.message.endswith("(at /1/parameters/properties/tags/uniqueItems)")
    assert not caught.value.wrong_type
    with pytest.raises(LoweringError) as wrong:
        lower("tools", "search")
    assert wrong.value.wrong_type


def test_formats_are_read_as_the_hole_says() -> None:
    dated = {"name": "book", "parameters": {"properties": {
        "day": {"type": "string", "format": "int32"}}}}
    with pytest.raises(LoweringError, match="unknown format"):
        lower("tools", [dated])
    assert lower("tools", [dated], JsonFormat(formats="annotation")).value_type == "json"


def test_the_call_keys_are_part_of_the_lowered_call() -> None:
    plain = lower("tools", [SEARCH])
    keys = CallKeys("function", "parameters", name_first=False)
    own = lower("tools", [SEARCH], keys=keys)
    assert own.pattern != plain.pattern and own.description == plain.description
    assert lower("tools", [SEARCH], keys=keys) is own  # remembered per value and keys
