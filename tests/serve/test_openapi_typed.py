"""qrun serve's description of a typed template (qrun/serve/catalog.py, openapi.py): the run
request's inputs are Query.input_schema (declared types, defaults, required), the response's
`output` is Query.output_schema. Pure functions: no server needed."""

from __future__ import annotations

from jsonschema import Draft202012Validator

import qrun
from qrun.serve.catalog import describe
from qrun.serve.openapi import openapi

TYPED = """---
inputs:
  name: {type: string, description: who to greet}
  count: integer = 2
output:
  mood: enum[happy, sad]
---
{{ name }}{{ count }}{{ select mood options=["happy", "sad"] }}"""


def test_request_and_response_schemas_of_a_typed_template() -> None:
    query = qrun.Query(TYPED)
    description = describe("greet", query)
    assert description["input_schema"] == query.input_schema
    document = openapi([description], "0")
    schemas = document["components"]["schemas"]
    inputs = schemas["greet.request"]["properties"]["inputs"]
    assert inputs["required"] == ["name"]
    assert inputs["properties"]["name"] == {"type": "string", "description": "who to greet"}
    assert inputs["properties"]["count"] == {"type": "integer", "default": 2}
    output = schemas["greet.response"]["properties"]["output"]
    assert output == query.output_schema
    Draft202012Validator.check_schema(inputs)
    validator = Draft202012Validator(inputs)
    assert validator.is_valid({"name": "Ada"})
    assert not validator.is_valid({"name": 3})
    assert "output" in schemas["greet.request"]["properties"]["fields"]["items"]["enum"]


def test_untyped_template_keeps_any_value_inputs() -> None:
    description = describe("qa", qrun.Query("{{ question }}{{ gen a }}"))
    inputs = openapi([description], "0")["components"]["schemas"]["qa.request"][
        "properties"]["inputs"]
    assert inputs == {"type": "object", "properties": {"question": {}},
                      "required": ["question"]}
    assert description["output_schema"] is None
