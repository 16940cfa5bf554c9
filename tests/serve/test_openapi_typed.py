"""qrun serve and typed templates (qrun/serve/catalog.py, openapi.py, app.py): the run
request's inputs are Query.input_schema (declared types, defaults, required), the response's
`output` is Query.output_schema; a request's typed inputs are checked (422) and its `fill`
gives holes their values, on a real server."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from jsonschema import Draft202012Validator
from serving import serving

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.serve import app
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
    assert schemas["greet.request"]["properties"]["fill"]["propertyNames"] == {"enum": ["mood"]}


def test_untyped_template_keeps_any_value_inputs() -> None:
    description = describe("qa", qrun.Query("{{ question }}{{ gen a }}"))
    inputs = openapi([description], "0")["components"]["schemas"]["qa.request"][
        "properties"]["inputs"]
    assert inputs == {"type": "object", "properties": {"question": {}},
                      "required": ["question"]}
    assert description["output_schema"] is None


@pytest.fixture(scope="module")
def url(tiny: TransformersBackend) -> Iterator[str]:
    with serving(app({"greet": qrun.Query(TYPED)}, model=tiny)) as address:
        yield address


def run(url: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{url}/v1/templates/greet/run", json=body, timeout=120)


def test_served_typed_run_with_fill_and_output(url: str) -> None:
    answer = run(url, {"inputs": {"name": "Ada"}, "fill": {"mood": "sad"},
                       "fields": ["text", "output", "holes"]})
    assert answer.status_code == 200, answer.text
    row = answer.json()
    assert row["text"] == "Ada2sad"
    assert row["output"] == {"mood": "sad"}
    assert row["holes"]["mood"]["finish"] == "filled"


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"inputs": {"name": 3}}, 422, "input 'name': 3 is not of type 'string'"),
    ({"inputs": {"name": "a"}, "fill": {"mood": "cross"}}, 422, "is not one of its options"),
    ({"inputs": {"name": "a"}, "fill": {"mod": "sad"}}, 422, "no hole of that name"),
    ({"inputs": {"name": "a"}, "fill": ["sad"]}, 400, '"fill" must be a JSON object'),
])
def test_served_bad_inputs_and_fills(url: str, body: dict[str, object], status: int,
                                     message: str) -> None:
    answer = run(url, body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]
