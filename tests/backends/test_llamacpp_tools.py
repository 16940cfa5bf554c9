"""Tool calls on the llamacpp backend (tests marked `llamacpp`, run in a pytest process of their
own): the GGUF's chat template (SmolLM2's) gives the same format and markers as the transformers
backend's, llama.cpp's rendering of a Qwen template reads the same tool-call format and tools
turn as transformers' does, and calls at temperature 1 are valid, in the default format and in
the model's own one. Skips without llama_cpp unless QRUN_REQUIRE_LLAMACPP=1."""

from __future__ import annotations

import json
from functools import partial

import jsonschema
import pytest
from chat_templates import QWEN
from tiers import require_llama_cpp

import qrun
from qrun.backends.chat_template import tool_call_format, tools_turn
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.tools import openai_tools, read_tools

pytestmark = pytest.mark.llamacpp

require_llama_cpp()

from qrun.backends.llamacpp import LlamaCppBackend, render_chat  # noqa: E402

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                               "days": {"type": "integer", "minimum": 1,
                                                        "maximum": 7}},
              "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Forecast <|im_end|>",
                                           "parameters": PARAMETERS}},
         {"name": "time", "parameters": {"properties": {"zone": {"enum": ["UTC", "CET"]}},
                                         "required": ["zone"]}}]
CHAT = ("{% system tools=tools %}Use a tool.{% endsystem %}{% user %}Weather in Oslo?{% enduser %}"
        "{% assistant %}{{ gen call tools=tools max_tokens=60 }}{% endassistant %}")


def test_smollm2_has_no_tool_format_on_either_backend(
        llama: LlamaCppBackend, smollm2: TransformersBackend) -> None:
    assert llama.tool_call_format() is None is smollm2.tool_call_format()
    tools = openai_tools(read_tools(TOOLS))
    assert llama.tools_turn(tools) is None is smollm2.tools_turn(tools)


def test_a_qwen_template_reads_alike_in_llamacpps_jinja(
        llama: LlamaCppBackend, smollm2: TransformersBackend) -> None:
    def hf(messages: list[dict[str, object]], tools: list[dict[str, object]] | None) -> str:
        return str(smollm2.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, chat_template=QWEN))

    ours = partial(render_chat, QWEN)
    found = tool_call_format(ours)
    assert found is not None and found.prefix == "<tool_call>\n"
    assert found == tool_call_format(hf)
    tools = openai_tools(read_tools(TOOLS))
    assert tools_turn(ours, tools, llama.control_tokens) == tools_turn(
        hf, tools, smollm2.control_tokens)


def check(value: object) -> str:
    assert isinstance(value, dict) and list(value) == ["name", "arguments"]
    schema = PARAMETERS if value["name"] == "weather" else TOOLS[1]["parameters"]
    jsonschema.Draft202012Validator(schema).validate(value["arguments"])
    return str(value["name"])


def test_calls_are_valid_at_temperature_one(llama: LlamaCppBackend) -> None:
    query = qrun.Query(CHAT)
    names = {check(query.run(model=llama, temperature=1.0, seed=seed, tools=TOOLS).vars["call"])
             for seed in range(12)}
    assert names <= {"weather", "time"} and names


def test_the_models_own_format_on_llamacpp(llama: LlamaCppBackend,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama, "_chat_template", lambda: QWEN)
    monkeypatch.setattr(llama, "_markers", {})
    monkeypatch.setattr(llama, "_tool_format", None)
    result = qrun.Query(CHAT).run(model=llama, temperature=1.0, seed=1, tools=TOOLS)
    check(result.vars["call"])
    text = result.holes["call"].text
    assert json.loads(text) == result.vars["call"]
    assert result.text.endswith(f"<tool_call>\n{text}\n</tool_call><|im_end|>\n")
    assert "<tools>\n" in result.text and '"description": "Forecast <|im_end|>"' in result.text
    assert result.token_ids.count(llama.control_tokens["<|im_end|>"]) == 3
