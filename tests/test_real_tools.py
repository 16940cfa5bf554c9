"""A tool-call hole on the real default model (SmolLM2-135M-Instruct, tests marked `real`): its
chat template has no tool-call format, so the tools are listed in the default text of the system
turn and the call is the JSON object alone; greedy, the call is valid under the chosen tool's
schema and the same on every run."""

from __future__ import annotations

import json

import jsonschema
import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.tool_calls import DEFAULT_HEADER

pytestmark = pytest.mark.real

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 40},
    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}
EMAIL = {"type": "object", "properties": {
    "to": {"type": "string", "maxLength": 60},
    "body": {"type": "string", "maxLength": 200}}, "required": ["to", "body"]}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": WEATHER}},
         {"type": "function", "function": {
             "name": "send_email", "description": "Send an email", "parameters": EMAIL}}]
TEMPLATE = """{% system tools=tools %}You are a helpful assistant.{% endsystem %}
{% user %}What is the weather like in Paris right now?{% enduser %}
{% assistant %}{{ gen call tools=tools max_tokens=100 }}{% endassistant %}"""


def test_a_greedy_call_is_valid_and_repeats(smollm2: TransformersBackend) -> None:
    query = qrun.Query(TEMPLATE)
    first = query.run(model=smollm2, tools=TOOLS)
    call = first.vars["call"]
    assert list(call) == ["name", "arguments"]
    schema = WEATHER if call["name"] == "get_weather" else EMAIL
    jsonschema.Draft202012Validator(schema).validate(call["arguments"])
    assert json.loads(first.holes["call"].text) == call
    assert DEFAULT_HEADER in first.text
    assert query.run(model=smollm2, tools=TOOLS).vars["call"] == call
