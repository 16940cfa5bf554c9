"""Typed inputs (qrun/lang/declared.py, docs/language.md §4.1): each compact spelling and its
JSON Schema, the mapping form, errors at their position, and inputs checked against their
types (with defaults applied) before any model work."""

from __future__ import annotations

from typing import Any

import pytest

from qrun.errors import InputError, TemplateError, TemplateErrors
from qrun.lang import compile_source
from qrun.lang.declared import MAX_TYPE_DEPTH, NO_DEFAULT, TypeSpellingError, read_compact
from qrun.lang.ir_dump import dump_program

# The table of docs/language.md §4.1: spelling -> (JSON Schema, optional, default).
COMPACT: list[tuple[str, dict[str, Any], bool, Any]] = [
    ("string", {"type": "string"}, False, NO_DEFAULT),
    ("integer", {"type": "integer"}, False, NO_DEFAULT),
    ("number", {"type": "number"}, False, NO_DEFAULT),
    ("boolean", {"type": "boolean"}, False, NO_DEFAULT),
    ("object", {"type": "object"}, False, NO_DEFAULT),
    ("list", {"type": "array"}, False, NO_DEFAULT),
    ("null", {"type": "null"}, False, NO_DEFAULT),
    ("any", {}, False, NO_DEFAULT),
    ("list[string]", {"type": "array", "items": {"type": "string"}}, False, NO_DEFAULT),
    ("list[object]", {"type": "array", "items": {"type": "object"}}, False, NO_DEFAULT),
    ("list[list[integer]]", {"type": "array", "items": {"type": "array",
                                                        "items": {"type": "integer"}}},
     False, NO_DEFAULT),
    ("dict[number]", {"type": "object", "additionalProperties": {"type": "number"}}, False,
     NO_DEFAULT),
    ("enum[a, b]", {"enum": ["a", "b"]}, False, NO_DEFAULT),
    ('enum["x, y", 3, true]', {"enum": ["x, y", 3, True]}, False, NO_DEFAULT),
    ("string?", {"type": "string"}, True, NO_DEFAULT),
    ("list[string]?", {"type": "array", "items": {"type": "string"}}, True, NO_DEFAULT),
    ("integer = 3", {"type": "integer"}, False, 3),
    ("number = 0.5", {"type": "number"}, False, 0.5),
    ("boolean = false", {"type": "boolean"}, False, False),
    ("string = hello world", {"type": "string"}, False, "hello world"),
    ('string = "quoted"', {"type": "string"}, False, "quoted"),
    ("list[string] = []", {"type": "array", "items": {"type": "string"}}, False, []),
    ("enum[low, high] = low", {"enum": ["low", "high"]}, False, "low"),
    ('enum["a=b", c] = "a=b"', {"enum": ["a=b", "c"]}, False, "a=b"),
    ('string = x = y', {"type": "string"}, False, "x = y"),
]


@pytest.mark.parametrize(("spelled", "schema", "optional", "default"), COMPACT,
                         ids=[case[0] for case in COMPACT])
def test_compact_spelling(spelled: str, schema: dict[str, Any], optional: bool,
                          default: Any) -> None:
    compact = read_compact(spelled)
    assert compact.schema == schema
    assert compact.optional is optional
    assert compact.default == default if default is not NO_DEFAULT \
        else compact.default is NO_DEFAULT


@pytest.mark.parametrize(("spelled", "message"), [
    ("str", "did you mean 'string'?"),
    ("strng", "did you mean 'string'?"),
    ("list[strin]", "unknown type 'strin'"),
    ("list[string?]", "at the end"),
    ("enum[a, a]", "distinct"),
    ("integer = three", "not a JSON value"),
    # Strict JSON (issue #38): no infinity from an overflowing float, no NaN, and an integer
    # past Python's digit limit is refused without echoing its digits.
    ("number = 1e999", "1e999 is too large for a float"),
    ("number = NaN", "NaN is not a JSON number"),
    ("integer = " + "9" * 5000, r"9{40}\.\.\. \(5000 characters\)' is not a JSON value: an "
     "integer with more than 4300 digits"),
    ("string[x]", "takes no arguments"),
    ("dict", "takes arguments"),
])
def test_compact_spelling_errors(spelled: str, message: str) -> None:
    with pytest.raises(TypeSpellingError, match=message.replace("?", r"\?").replace("[", r"\[")):
        read_compact(spelled)


TYPED = """---
inputs:
  name: string
  count: integer = 3
  tags: list[string]
  nickname: string?
  level:
    type: integer
    minimum: 1
    description: how hard
    default: 2
  user:
    type: object
    properties: {age: {type: integer}}
    optional: true
---
{{ name }}{{ count }}{% for t in tags %}{{ t }}{% endfor %}{{ nickname | default('') }}\
{{ level }}{{ user | default('') }}"""


def test_typed_inputs_required_optional_and_schema() -> None:
    program = compile_source(TYPED)
    assert program.inputs == ("name", "tags")
    assert program.optional_inputs == ("count", "nickname", "level", "user")
    schema = program.input_schema
    assert schema["required"] == ["name", "tags"]
    assert schema["properties"]["count"] == {"type": "integer", "default": 3}
    assert schema["properties"]["level"] == {"type": "integer", "minimum": 1,
                                             "description": "how hard", "default": 2}
    assert "optional" not in schema["properties"]["user"]


def test_inputs_checked_and_defaults_applied() -> None:
    program = compile_source(TYPED)
    checked = program.check_inputs({"name": "a", "tags": ["x"]})
    assert checked == {"name": "a", "tags": ["x"], "count": 3, "level": 2}


@pytest.mark.parametrize(("inputs", "message", "line"), [
    ({"name": 1, "tags": []}, "input 'name': 1 is not of type 'string'", 3),
    ({"name": "a", "tags": ["x", 2]}, "input 'tags' at [1]: 2 is not of type 'string'", 5),
    ({"name": "a", "tags": [], "level": 0}, "input 'level': 0 is less than the minimum of 1",
     7),
    ({"name": "a", "tags": [], "user": {"age": "old"}},
     "input 'user' at ['age']: 'old' is not of type 'integer'", 12),
    ({"name": "a", "tags": [], "count": True}, "input 'count': True is not of type 'integer'",
     4),
])
def test_input_that_does_not_fit_its_type(inputs: dict[str, Any], message: str,
                                          line: int) -> None:
    program = compile_source(TYPED, "t.tmpl")
    with pytest.raises(InputError) as info:
        program.check_inputs(inputs)
    assert message in info.value.message
    assert info.value.span.line == line
    assert info.value.exit_code == 2


def errors_of(text: str) -> tuple[TemplateError, ...]:
    with pytest.raises(TemplateErrors) as info:
        compile_source(text, "t.tmpl")
    return tuple(info.value.errors)


@pytest.mark.parametrize(("front", "line", "column", "message"), [
    ("inputs:\n  n: integr\n", 3, 6, "unknown type 'integr'"),
    ("inputs:\n  n: integer = x\n", 3, 6, "not a JSON value"),
    ("inputs:\n  n: integer = 1.5\n", 3, 6, "its default does not fit"),
    ("inputs:\n  n: {type: integer, minimum: low}\n", 3, 31, "not a JSON Schema"),
    ("inputs:\n  n: {type: strin}\n", 3, 13, "unknown type 'strin'"),
    ("inputs:\n  n: {type: integer, optional: maybe}\n", 3, 32, "optional must be"),
    ("inputs:\n  n: [string]\n", 3, 6, "a type is a name"),
    ("inputs: 3\n", 2, 9, "must be a list"),
    ("output: [a]\n", 2, 9, "must be a mapping"),
    ("output: {type: object}\n", 2, 9, "with properties"),
])
def test_bad_declarations_are_positioned(front: str, line: int, column: int,
                                         message: str) -> None:
    errors = errors_of(f"---\n{front}---\n{{{{ n }}}}")
    assert message in errors[0].message, errors[0].render()
    assert (errors[0].span.line, errors[0].span.column) == (line, column), errors[0].render()


def test_dump_shows_declared_types() -> None:
    dump = dump_program(compile_source(
        "---\ninputs:\n  n: integer = 3\noutput:\n  a: integer\n---\n"
        "{{ n }}{{ gen a regex=INT }}"))
    assert 'type n: {"type": "integer", "default": 3}\n' in dump
    assert 'output: {"type": "object", "properties": {"a": {"type": "integer"}}, ' \
        '"required": ["a"]}\n' in dump


@pytest.mark.parametrize(("front", "line", "column"), [
    ('inputs:\n  x: {$ref: "#/nope"}\n', 3, 7),
    ('inputs:\n  x:\n    $defs: {a: {type: integer}}\n    $ref: "#/$defs/a"\n', 5, 5),
    ('inputs:\n  x: {type: array, items: {anyOf: [{type: string}, {$ref: "#"}]}}\n', 3, 53),
    ('output:\n  x:\n    $defs: {a: {type: integer}}\n    $ref: "#/$defs/a"\n', 5, 5),
])
def test_a_reference_in_a_declared_type_is_refused_where_it_is(front: str, line: int,
                                                                column: int) -> None:
    # A declared type sits under the record's properties (Program.input_schema), where its
    # $ref would resolve against the record: "#/$defs/a" points at nothing there.
    with pytest.raises(TemplateErrors) as info:
        body = "{{ x }}" if front.startswith("inputs") else "{{ gen x regex=INT }}"
        compile_source(f"---\n{front}---\n{body}", "t.tmpl")
    err, = info.value.errors[:1]
    assert "$ref is not allowed in a declared type" in err.message, err.render()
    assert (err.span.line, err.span.column) == (line, column), err.render()


def test_a_compact_type_nests_at_most_max_type_depth() -> None:
    assert read_compact("list[" * MAX_TYPE_DEPTH + "integer" + "]" * MAX_TYPE_DEPTH)
    with pytest.raises(TypeSpellingError, match="nests more than 32 levels"):
        read_compact("list[" * (MAX_TYPE_DEPTH + 1) + "integer" + "]" * (MAX_TYPE_DEPTH + 1))
    deep = "list[" * 3000 + "integer" + "]" * 3000
    with pytest.raises(TemplateErrors) as info:
        compile_source(f'---\ninputs:\n  x: "{deep}"\n---\n{{{{ x }}}}', "t.tmpl")
    err = info.value.errors[0]  # (then 'x' is unknown: its declaration is refused)
    assert "nests more than 32 levels deep" in err.message
    assert (err.span.line, err.span.column) == (3, 6)
