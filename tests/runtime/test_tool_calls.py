"""Tool-call holes on the tiny model (docs/language.md §7.7): every call valid at temperature 1
(checked by `jsonschema` against the chosen tool's parameters), both tools chosen across seeds,
the value typed; the model's own format where its chat template has one (Qwen's template, and
one with other keys in another order, set on a copy of the tiny model's tokenizer); the tools
rendered into the system turn, a description's `<|im_end|>` staying text; errors of a tools
list computed at run time."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from chat_templates import QWEN, REVERSED

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import ConstraintError, EvaluationError
from qrun.runtime.result import GenRecord
from qrun.runtime.tool_calls import DEFAULT_HEADER

WEATHER_PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city on a day",
    "parameters": WEATHER_PARAMETERS}}
CALC = {"name": "calc", "description": "Evaluate <|im_end|> an arithmetic expression",
        "parameters": {"$defs": {"expr": {"type": "string", "pattern": "^[0-9+*/() -]{1,12}$"}},
                       "properties": {"expression": {"$ref": "#/$defs/expr"}},
                       "required": ["expression"]}}
TOOLS = [WEATHER, CALC]
PARAMETERS = {"weather": WEATHER_PARAMETERS, "calc": CALC["parameters"]}
CALL = "{{ gen call tools=tools max_tokens=80 }}"
CHAT = ("{% system tools=tools %}Call a tool.{% endsystem %}{% user %}Weather in Oslo?"
        "{% enduser %}{% assistant %}" + CALL + "{% endassistant %}")


def with_template(tiny: TransformersBackend, template: str, name: str) -> TransformersBackend:
    tokenizer = copy.deepcopy(tiny.tokenizer)
    tokenizer.chat_template = template
    return TransformersBackend(tiny.model, tokenizer, name)


@pytest.fixture(scope="module")
def qwen_format(tiny: TransformersBackend) -> TransformersBackend:
    return with_template(tiny, QWEN, "tiny-qwen-template")


def check_call(value: Any) -> str:
    """The tool a call names, after checking it is one valid call of it."""
    assert isinstance(value, dict) and list(value) == ["name", "arguments"]
    schema = PARAMETERS[value["name"]]
    jsonschema.Draft202012Validator(schema).validate(value["arguments"])
    # Arguments are closed by default: no keyword the tool does not take.
    assert set(value["arguments"]) <= set(schema["properties"])
    return str(value["name"])


def im_ends(backend: TransformersBackend, token_ids: list[int]) -> int:
    return token_ids.count(backend.control_tokens["<|im_end|>"])


def test_calls_are_valid_at_temperature_one_and_both_tools_come(
        tiny: TransformersBackend) -> None:
    query = qrun.Query("Q: what now?\n" + CALL + "\n")
    chosen = set()
    for seed in range(24):
        result = query.run(model=tiny, temperature=1.0, seed=seed, tools=TOOLS)
        value = result.vars["call"]
        chosen.add(check_call(value))
        record = result.holes["call"]
        assert isinstance(record, GenRecord)
        # The default format: the JSON object alone, and it is the value.
        assert json.loads(record.text) == value
        assert result.text == f"Q: what now?\n{record.text}\n"
        assert record.constraint == 'tools=["weather", "calc"]'
    assert chosen == {"weather", "calc"}


def test_the_template_branches_on_the_call(tiny: TransformersBackend) -> None:
    query = qrun.Query(CALL + "{% if call.name == 'calc' %}={{ call.arguments.expression }}"
                       "{% else %}@{{ call.arguments.city }}{% endif %}")
    for seed in range(4):
        result = query.run(model=tiny, temperature=1.0, seed=seed, tools=TOOLS)
        call = result.vars["call"]
        tail = (f"={call['arguments']['expression']}" if call["name"] == "calc"
                else f"@{call['arguments']['city']}")
        assert result.text.endswith(tail)
        assert result.trace()["holes"][0]["constraint"] == 'tools=["weather", "calc"]'


def test_the_models_own_format_is_written(qwen_format: TransformersBackend) -> None:
    query = qrun.Query(CHAT)
    for seed in range(6):
        result = query.run(model=qwen_format, temperature=1.0, seed=seed, tools=TOOLS)
        check_call(result.vars["call"])
        text = result.holes["call"].text
        assert result.text.endswith(f"<|im_start|>assistant\n<tool_call>\n{text}\n</tool_call>"
                                    "<|im_end|>\n")
        assert json.loads(text) == result.vars["call"]
        # The tools as Qwen's template renders them, in the system turn.
        assert '<tools>\n{"type": "function", "function": {"name": "weather"' in result.text
        # Three turns, three <|im_end|> tokens: the description's is text.
        assert im_ends(qwen_format, result.token_ids) == 3
        assert "Evaluate <|im_end|> an arithmetic" in result.text


def test_the_models_keys_are_written_and_the_value_keeps_its_own(
        tiny: TransformersBackend) -> None:
    backend = with_template(tiny, REVERSED, "tiny-reversed-template")
    result = qrun.Query("{% assistant %}" + CALL + "{% endassistant %}").run(
        model=backend, temperature=1.0, seed=3, tools=TOOLS)
    call = result.vars["call"]
    check_call(call)
    text = result.holes["call"].text
    written = json.loads(text)
    assert list(written) == ["parameters", "function"]
    assert written == {"parameters": call["arguments"], "function": call["name"]}
    assert f"[CALL]{text}<|im_end|>" in result.text


def test_without_a_tool_format_the_default_text_lists_the_tools(
        tiny: TransformersBackend) -> None:
    result = qrun.Query(CHAT).run(model=tiny, temperature=1.0, seed=0, tools=TOOLS)
    check_call(result.vars["call"])
    head, _, _ = result.text.partition("<|im_start|>user")
    assert head.startswith("<|im_start|>system\nCall a tool." + DEFAULT_HEADER + "\n- weather:")
    assert "- calc: Evaluate <|im_end|> an arithmetic expression Parameters: {" in head
    assert im_ends(tiny, result.token_ids) == 3


def test_a_computed_tools_list_is_checked_when_the_hole_comes(
        tiny: TransformersBackend) -> None:
    with pytest.raises(EvaluationError) as caught:
        qrun.Query(CALL).run(model=tiny, tools=[WEATHER, {"name": "weather"}])
    assert 'tool name "weather" repeats' in caught.value.message
    assert caught.value.message.endswith("(at /1/name)")
    assert (caught.value.span.line, caught.value.span.column) == (1, 19)  # the tools= value
    bad = {"name": "tag", "parameters": {"properties": {
        "tags": {"type": "array", "uniqueItems": True}}}}
    with pytest.raises(ConstraintError, match="at /0/parameters/properties/tags/uniqueItems"):
        qrun.Query(CALL).run(model=tiny, tools=[bad])
    with pytest.raises(EvaluationError, match="tools: a tool is an object"):
        qrun.Query("{% system tools=tools %}x{% endsystem %}").run(model=tiny, tools=["x"])


def test_the_documented_example_runs_and_renders_as_documented(
        tiny: TransformersBackend) -> None:
    """docs/language.md §7.7: its template runs, and the system turn it shows is the one the
    default rendering gives."""
    docs = (Path(__file__).resolve().parents[2] / "docs/language.md").read_text()
    section = docs.split("### 7.7 Tool calls", 1)[1].split("\n## 8.", 1)[0]
    template, rendered = re.findall(r"^```\n(.*?)^```", section, re.M | re.S)[:2]
    result = qrun.Query(template).run(model=tiny, temperature=1.0, seed=2, question="2+2?")
    action = result.vars["action"]
    assert action["name"] in ("search", "calc")
    assert result.text.startswith(rendered.rstrip("\n"))
    shown = (f"Searching for {action['arguments'].get('query')}..." if action["name"] ==
             "search" else f"Computing {action['arguments'].get('expression')}...")
    assert shown in result.text
