"""Tool calls on vLLM in process (tests marked `vllm`): the engine's tokenizer is the model's own,
so the format and the tools turn are read as on transformers; calls are valid at temperature 1
and the greedy call is the transformers backend's."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

import qrun
from qrun.backends.transformers import TransformersBackend

pytestmark = pytest.mark.vllm

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "unit": {"enum": ["C", "F"]}},
              "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Forecast",
                                           "parameters": PARAMETERS}},
         {"name": "now", "description": "The time now"}]
CHAT = ("{% system tools=tools %}Use a tool.{% endsystem %}{% user %}Weather in Oslo?{% enduser %}"
        "{% assistant %}{{ gen call tools=tools max_tokens=60 }}{% endassistant %}")


@pytest.fixture(scope="module")
def vllm_local(vllm_engine: Any) -> Any:
    return vllm_engine


def check(value: Any) -> None:
    assert list(value) == ["name", "arguments"]
    schema = PARAMETERS if value["name"] == "weather" else {"additionalProperties": False}
    jsonschema.Draft202012Validator(schema).validate(value["arguments"])


def test_calls_on_vllm(vllm_local: Any, smollm2: TransformersBackend) -> None:
    assert vllm_local.tool_call_format() is None  # SmolLM2's template writes no calls
    query = qrun.Query(CHAT)
    for seed in range(4):
        check(query.run(model=vllm_local, temperature=1.0, seed=seed, tools=TOOLS).vars["call"])
    greedy = query.run(model=vllm_local, tools=TOOLS)
    check(greedy.vars["call"])
    assert greedy.text == query.run(model=smollm2, tools=TOOLS).text
