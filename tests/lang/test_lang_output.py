"""The `output:` proof (qrun/lang/output.py, docs/language.md §4.2): each property of the result
record is a capture whose holes can only give values that fit; what cannot be proven is an
error at the hole, saying why. And the typed-input warnings of lang/lint.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qrun.errors import TemplateError, TemplateErrors
from qrun.lang import compile_source
from qrun.lang.output import contained


def errors_of(text: str) -> tuple[TemplateError, ...]:
    with pytest.raises(TemplateErrors) as info:
        compile_source(text, "t.tmpl")
    return tuple(info.value.errors)


PROVEN = [
    ("age: integer", "{{ gen age regex=INT }}"),
    ("age: number", "{{ gen age regex=INT }}"),
    ("x: number", "{{ gen x regex=FLOAT }}"),
    ("ok: boolean", "{{ gen ok regex=BOOL }}"),
    ("name: string", "{{ gen name stop='\\n' }}"),
    ("name: string", '{{ gen name regex="[a-z]+" }}'),
    ("mood: enum[happy, sad, meh]", '{{ select mood options=["happy", "sad"] }}'),
    ("mood: string", '{{ select mood options=["happy", "sad"] }}'),
    ("p: {type: object, properties: {a: {type: integer}}, required: [a]}",
     '{{ gen p json={"type": "object", "properties": {"a": {"type": "integer"}}, '
     '"required": ["a"]} }}'),
    ("p: {type: object, properties: {a: {type: number}}}",
     '{{ gen p json={"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}} '
     '}}'),
    ("p: {type: object, properties: {a: {type: integer}}, additionalProperties: false}",
     '{{ gen p json={"type": "object", "properties": {"a": {"type": "integer"}}} closed=true }}'),
    ("n: {type: integer, minimum: 0}", '{{ gen n json={"type": "integer", "minimum": 3} }}'),
    ("xs: list[integer]", "{% for i in range(2) %}{{ gen xs regex=INT }}{% endfor %}"),
    ("c: {type: object, properties: {name: {type: string}}}",
     '{{ gen c tools=[{"type": "function", "function": {"name": "f", "parameters": '
     '{"type": "object"}}}] }}'),
    ("w: {type: string, pattern: '^[0-9]+$'}", '{{ gen w regex="[0-9]+" }}'),
    # options and a regex computed at run time: still text (select takes only strings)
    ("pick: string", '{% set opts = ["a", "b"] %}{{ select pick options=opts }}'),
    ("code: string", '{% set rx = "[0-9]+" %}{{ gen code regex=rx }}'),
    # a name set once, at the top level, to a literal holds it (output.constant_sets)
    ("n: {type: integer, minimum: 0}",
     '{% set s = {"type": "integer", "minimum": 3} %}{{ gen n json=s }}'),
    ("pick: enum[a, b]", '{% set opts = ["a", "b"] %}{{ select pick options=opts }}'),
    # the hole's $refs are followed inside its own schema, recursion included
    ("c: object", '{{ gen c json={"$defs": {"n": {"type": "object"}}, "$ref": "#/$defs/n"} }}'),
    ("tree: {type: object, properties: {name: {type: string}, kids: {type: array, items: "
     "{type: object, properties: {name: {type: string}}, required: [name]}}}, "
     "required: [name]}",
     '{{ gen tree json={"$ref": "#/definitions/node", "definitions": {"node": {"type": '
     '"object", "properties": {"name": {"type": "string"}, "kids": {"type": "array", '
     '"items": {"$ref": "#/definitions/node"}}}, "required": ["name"]}}} }}'),
]


@pytest.mark.parametrize(("output", "body"), PROVEN)
def test_proven_outputs_compile(output: str, body: str) -> None:
    program = compile_source(f"---\noutput:\n  {output}\n---\n{body}")
    assert program.output_schema is not None


UNPROVEN = [
    ("age: integer", "{{ gen age stop='\\n' }}", "it gives string values, not integer",
     "any text"),
    ("age: integer", "{{ gen age regex=FLOAT }}", "it gives number values, not integer", ""),
    ("mood: enum[happy, sad]", '{{ select mood options=["happy", "cross"] }}',
     'it may give "cross"', ""),
    ("p: {type: object, properties: {a: {type: integer}}, required: [a]}",
     '{{ gen p json={"type": "object", "properties": {"a": {"type": "integer"}}} }}',
     "it may leave out a", ""),
    ("p: {type: object, properties: {a: {type: integer}}, additionalProperties: false}",
     '{{ gen p json={"type": "object", "properties": {"a": {"type": "integer"}}} }}',
     "closed=true", ""),
    ("n: {type: integer, maximum: 10}", '{{ gen n json={"type": "integer"} }}',
     "does not guarantee maximum 10", ""),
    ("xs: integer", "{% for i in range(2) %}{{ gen xs regex=INT }}{% endfor %}",
     "it gives array values", "a list"),
    ("r: string", "{% set s = {} %}{{ gen r json=s }}", "it may give any JSON value",
     ""),
    ("r: string", "{% set s = {} | tojson %}{{ gen r json=s }}", "computed at run time", ""),
    ("pick: enum[a, b]", '{% set opts = ["a", "c"] %}{{ select pick options=opts }}',
     'it may give "c"', ""),
    # set twice, or from something computed: not a constant
    ("n: integer", '{% set s = {"type": "integer"} %}{% if true %}{% set s = {} %}{% endif %}'
     '{{ gen n json=s }}', "computed at run time", ""),
    ("n: integer", '{% set s = {"type": "integer"} | tojson %}{{ gen n json=s }}',
     "computed at run time", ""),
    ("code: integer", '{% set rx = "[0-9]+" %}{{ gen code regex=rx }}',
     "it gives string values, not integer", ""),
]


@pytest.mark.parametrize(("output", "body", "reason", "note"), UNPROVEN)
def test_unproven_output_is_an_error_at_the_hole(output: str, body: str, reason: str,
                                                 note: str) -> None:
    errors = errors_of(f"---\noutput:\n  {output}\n---\nx\n{body}")
    assert len(errors) == 1, [e.render() for e in errors]
    err = errors[0]
    assert reason in err.message, err.render()
    assert err.span.line == 6, err.render()
    hole = "{{ gen" if "gen" in body else "{{ select"
    assert err.span.column == body.index(hole) + 1, err.render()
    assert note in " ".join(err.notes)


def test_output_property_that_is_no_capture() -> None:
    errors = errors_of("---\noutput:\n  age: integer\n---\n{{ gen agee regex=INT }}")
    assert "output property 'age' is not a capture" in errors[0].message
    assert errors[0].span.line == 2
    assert "captures: agee" in errors[0].notes[0]


def test_output_as_json_schema() -> None:
    program = compile_source("---\noutput:\n  type: object\n  properties:\n    a: {type: "
                             "integer}\n  required: [a]\n---\n{{ gen a regex=INT }}")
    assert program.output_schema == {"type": "object", "properties": {"a": {"type": "integer"}},
                                     "required": ["a"]}


def test_optional_output_property_is_not_required() -> None:
    program = compile_source("---\noutput:\n  a: integer?\n  b: string\n---\n"
                             "{{ gen a regex=INT }}{{ gen b }}")
    assert program.output_schema is not None
    assert program.output_schema["required"] == ["b"]


@pytest.mark.parametrize(("given", "wanted", "proven"), [
    ({"type": "integer"}, {"type": ["number", "null"]}, True),
    ({"type": ["integer", "null"]}, {"type": "integer"}, False),
    ({"anyOf": [{"type": "integer"}, {"const": "x"}]}, {"type": ["integer", "string"]}, True),
    ({"type": "string"}, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, True),
    ({"type": "string", "minLength": 2}, {"type": "string", "minLength": 1}, True),
    ({"type": "string"}, {"type": "string", "format": "email"}, False),
    ({"type": "array", "items": {"type": "integer"}}, {"type": "array",
                                                       "items": {"type": "number"}}, True),
    ({}, {"type": "string"}, False),
    ({"enum": [1, 2]}, {"type": "integer", "maximum": 2}, True),
])
def test_containment(given: dict[str, object], wanted: dict[str, object], proven: bool) -> None:
    assert (contained(given, wanted) is None) is proven


# ---- typed inputs' uses (lang/lint.py) ----------------------------------------------------------


def test_loop_over_a_declared_string_is_a_warning() -> None:
    program = compile_source("---\ninputs:\n  name: string\n---\n"
                             "{% for c in name %}{{ c }}{% endfor %}", "t.tmpl")
    warning, = program.warnings
    assert "'name' is declared as string, so a loop over it goes over its characters" \
        in warning.message
    assert (warning.span.line, warning.span.column) == (5, 13)


def test_loop_over_a_declared_number_is_a_warning() -> None:
    warning, = compile_source("---\ninputs:\n  n: integer\n---\n"
                              "{% for c in n %}{{ c }}{% endfor %}").warnings
    assert "fails when it runs" in warning.message


def test_missing_attribute_of_a_closed_object_is_a_warning() -> None:
    program = compile_source(
        "---\ninputs:\n  user:\n    type: object\n    properties: {name: {type: string}, "
        "address: {type: object, properties: {city: {type: string}}, "
        "additionalProperties: false}}\n    additionalProperties: false\n---\n"
        "{{ user.name }} {{ user.age }} {{ user.address.zip }} {{ user.name.first }}")
    messages = [w.message for w in program.warnings]
    assert messages == [
        "'user' is declared with properties name, address only: 'age' is never there",
        "'user.address' is declared with properties city only: 'zip' is never there",
        "'user.name' is declared as string, which has no attribute 'first'",
    ]
    assert program.warnings[0].span.line == 8


def test_open_object_and_list_form_inputs_get_no_warning() -> None:
    assert compile_source("---\ninputs:\n  user: object\n---\n{{ user.age }}").warnings == ()
    assert compile_source("---\ninputs: [name]\n---\n{% for c in name %}{% endfor %}"
                          ).warnings == ()
    # A loop variable hides the input's name.
    assert compile_source("---\ninputs:\n  n: string\n---\n{% for n in [[1]] %}"
                          "{% for x in n %}{% endfor %}{% endfor %}").warnings == ()


# ---- the examples of docs/language.md §4 ---------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs/language.md"


def section_4_examples() -> list[str]:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## 4. Front matter"):text.index("## 5. Inputs")]
    return re.findall(r"^```\n(---\n.*?)^```", section, re.M | re.S)


def test_the_docs_examples_compile_as_documented() -> None:
    first, typed, output = section_4_examples()
    assert compile_source(first).inputs == ("question",)
    program = compile_source(typed + "{{ question }}{{ user.email }}", "t.tmpl")
    assert program.inputs == ("question",)
    assert program.input_schema["properties"]["level"]["maximum"] == 5
    warning, = program.warnings  # the doc's `user.email`
    assert "'email' is never there" in warning.message
    assert compile_source(output).output_schema == {
        "type": "object", "required": ["age", "mood", "tags"], "properties": {
            "age": {"type": "integer"}, "mood": {"enum": ["happy", "sad"]},
            "tags": {"type": "array", "items": {"type": "string"}}}}


def test_required_output_captured_on_some_paths_only() -> None:
    errors = errors_of("---\ninputs: [x]\noutput:\n  a: integer\n---\n"
                       "{% if x %}{{ gen a regex=INT }}{% endif %}")
    assert "output 'a' is required, but a run may end without capturing it" \
        in errors[0].message
    assert (errors[0].span.line, errors[0].span.column) == (6, 11)
    compile_source("---\ninputs: [x]\noutput:\n  a: integer?\n---\n"
                   "{% if x %}{{ gen a regex=INT }}{% endif %}")
    compile_source("---\ninputs: [x]\noutput:\n  a: integer\n---\n"
                   "{% if x %}{{ gen a regex=INT }}{% else %}{{ gen a regex=INT }}{% endif %}")
    compile_source("---\ninputs: [x]\noutput:\n  a: list[integer]\n---\n"
                   "{% for i in x %}{% if i %}{{ gen a regex=INT }}{% endif %}{% endfor %}")


# ---- what the proof must refuse (each was proven, then the run failed: "does not fit") --------


def one_reason(output: str, body: str) -> str:
    errors = errors_of(f"---\noutput:\n  {output}\n---\n{body}")
    assert len(errors) == 1, [e.render() for e in errors]
    return errors[0].message


def test_a_json_pattern_is_a_search_not_a_full_match() -> None:
    # "bab" fits pattern "a" (searched for) but not "^a$".
    message = one_reason("x: {type: string, pattern: '^a$'}",
                         '{{ gen x json={"type": "string", "pattern": "a"} }}')
    assert "pattern" in message
    compile_source("---\noutput:\n  x: {type: string, pattern: 'a'}\n---\n"
                   '{{ gen x json={"type": "string", "pattern": "a"} }}')
    compile_source("---\noutput:\n  x: {type: string, pattern: '^(?:a)$'}\n---\n"
                   '{{ gen x regex="a" }}')


def test_closed_is_read_from_the_option_not_the_description() -> None:
    message = one_reason(
        "p: {type: object, properties: {a: {type: integer}}, additionalProperties: false}",
        '{{ gen p json={"type": "object", "title": "closed=true", '
        '"properties": {"a": {"type": "integer"}}} }}')
    assert "closed=true" in message or "does not list" in message


def test_pattern_properties_of_the_hole_must_fit() -> None:
    message = one_reason(
        "p: {type: object, properties: {a: {type: integer}}}",
        '{{ gen p json={"type": "object", "patternProperties": {"^a": {"type": "string"}}} '
        'closed=true }}')
    assert "patternProperties" in message
    message = one_reason(
        "p: {type: object, additionalProperties: {type: integer}}",
        '{{ gen p json={"type": "object", "properties": {"a": {"type": "integer"}}, '
        '"patternProperties": {"^b": {"type": "string"}}} closed=true }}')
    assert "patternProperties" in message


def test_prefix_items_and_list_items_are_not_proven() -> None:
    message = one_reason("xs: list[integer]",
                         '{{ gen xs json={"type": "array", "prefixItems": [{"type": "string"}], '
                         '"items": {"type": "integer"}} }}')
    assert "prefixItems" in message
    assert contained({"type": "array", "items": [{"type": "integer"}]},
                     {"type": "array", "items": {"type": "integer"}}) is not None
    assert contained({"type": "array", "items": {"type": "integer"}},
                     {"type": "array", "items": [{"type": "integer"}]}) is not None
    assert contained({"type": "array", "items": {"type": "integer"}, "additionalItems": False},
                     {"type": "array", "items": {"type": "integer"}}) is not None


def test_refs_are_not_compared_as_text() -> None:
    message = one_reason(
        "p: {type: object, properties: {a: {$ref: '#/$defs/n'}}, $defs: {n: {type: integer}}}",
        '{{ gen p json={"$defs": {"n": {"type": "string"}}, "type": "object", '
        '"properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]} }}')
    assert "$ref" in message
    assert contained({"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}) is not None


@pytest.mark.parametrize(("extra", "wrong"), [
    ("  required: [x, y]\n", "required 'y' is not one of its properties"),
    ("  minProperties: 2\n", "'minProperties' is not proven"),
    ("  additionalProperties: {type: integer}\n", "'additionalProperties' is not proven"),
])
def test_top_of_a_written_out_output_is_only_its_properties(extra: str, wrong: str) -> None:
    errors = errors_of("---\noutput:\n  type: object\n  properties:\n    x: {type: integer}\n"
                       f"{extra}---\n{{{{ gen x regex=INT }}}}")
    assert len(errors) == 1 and wrong in errors[0].message, [e.render() for e in errors]
    assert errors[0].span.line == 6


def test_boolean_bounds_are_not_numbers() -> None:
    assert contained({"type": "number", "exclusiveMaximum": True},
                     {"type": "number", "exclusiveMaximum": 5}) is not None
    assert contained({"type": "number", "maximum": 1},
                     {"type": "number", "maximum": True}) is not None


@pytest.mark.parametrize(("schema", "reason"), [
    ({"$defs": {"n": {"type": "string"}}, "$ref": "#/$defs/n"},
     "it gives string values, not integer"),
    ({"$ref": "#/$defs/gone"}, 'its $ref "#/$defs/gone" points at nothing'),
    ({"$ref": "other.json#/a"}, 'its $ref "other.json#/a" points outside the schema'),
    ({"$ref": "#"}, "its $ref chain is longer than 32 (or a loop)"),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3},
     "it uses $ref beside minimum"),
    ({"$defs": {"n": {"$id": "n.json", "type": "integer"}}, "$ref": "#/$defs/n"},
     "with an inner $id"),
    ({"$dynamicRef": "#node"}, "it uses $dynamicRef"),
])
def test_a_ref_the_proof_cannot_follow_says_why(schema: dict[str, object], reason: str) -> None:
    found = contained(schema, {"type": "integer"})
    assert found is not None and reason in found


def test_refs_resolve_in_the_holes_own_schema_at_every_depth() -> None:
    schema = {"$defs": {"a/b": {"type": "integer", "minimum": 1}, "list": {
        "type": "array", "items": {"$ref": "#/$defs/a~1b"}}}, "$ref": "#/$defs/list"}
    assert contained(schema, {"type": "array", "items": {"type": "integer"}}) is None
    found = contained(schema, {"type": "array", "items": {"type": "integer", "minimum": 2}})
    assert found is not None and "minimum 2" in found
