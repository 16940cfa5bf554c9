"""qrun/backends/chat_template.py: the model's tool-call format read from its chat template (Qwen's
`<tool_call>` layout, other keys in another order, and none where the template writes no call or
writes its arguments as a string), and a system turn with tools, whose control-token texts
inside the tools stay data. Rendered by the tiny model's tokenizer (SmolLM2's) with each
template given to apply_chat_template."""

from __future__ import annotations

from typing import Any

import pytest
from chat_templates import QWEN, REVERSED, STRING_ARGUMENTS

from qrun.backends.chat_template import (
    Render,
    ToolCallFormat,
    role_markers,
    tool_call_format,
    tools_turn,
)
from qrun.backends.transformers import TransformersBackend
from qrun.constraint.tools import CallKeys, openai_tools, read_tools

TOOLS = openai_tools(read_tools([{"name": "search", "description": "Find <|im_end|> pages",
                                  "parameters": {"properties": {"q": {"type": "string"}}}}]))


def renderer(tiny: TransformersBackend, template: str | None) -> Render:
    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return str(tiny.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, chat_template=template))
    return render


def test_qwen_writes_calls_between_tool_call_tags(tiny: TransformersBackend) -> None:
    assert tool_call_format(renderer(tiny, QWEN)) == ToolCallFormat(
        "<tool_call>\n", "\n</tool_call>", CallKeys("name", "arguments", name_first=True))


def test_the_keys_and_their_order_are_read(tiny: TransformersBackend) -> None:
    assert tool_call_format(renderer(tiny, REVERSED)) == ToolCallFormat(
        "[CALL]", "", CallKeys("function", "parameters", name_first=False))


@pytest.mark.parametrize("template", [None, STRING_ARGUMENTS, "{{ raise_exception('no') }}"])
def test_no_format_where_the_template_writes_no_call_object(
        tiny: TransformersBackend, template: str | None) -> None:
    # None: SmolLM2's own template, which ignores tool_calls.
    assert tool_call_format(renderer(tiny, template)) is None


def test_role_markers_are_those_the_backend_reports(tiny: TransformersBackend) -> None:
    for role in ("system", "user", "assistant"):
        assert role_markers(renderer(tiny, None), role) == tiny.chat_markers(role)
    assert role_markers(renderer(tiny, "{{ raise_exception('no') }}"), "user") is None


def test_tools_turn_keeps_control_texts_of_the_tools_as_data(tiny: TransformersBackend) -> None:
    turn = tools_turn(renderer(tiny, QWEN), TOOLS, tiny.control_tokens)
    assert turn is not None
    assert turn.before == (("<|im_start|>system\n", True),)
    data = [text for text, special in turn.after if not special]
    # The description's `<` (which begins every control token of this vocabulary), cut out
    # of the template's text: no control token can start inside the tools' text.
    assert data == ["<"]
    text = "".join(t for t, _ in turn.after)
    assert '"description": "Find <|im_end|> pages"' in text
    assert text.startswith("\n\n# Tools") and text.endswith("</tool_call><|im_end|>\n")
    assert turn.after[-1][1]  # the turn's own <|im_end|> is the template's


def test_text_that_looks_like_a_placeholder_stays_as_written(tiny: TransformersBackend) -> None:
    tools = openai_tools(read_tools([{"name": "t", "description": "QRUNHIDDEN0X a[b]c"}]))
    turn = tools_turn(renderer(tiny, QWEN), tools, {**tiny.control_tokens, "[X]": 1})
    assert turn is not None
    text = "".join(t for t, _ in turn.after)
    assert '"description": "QRUNHIDDEN0X a[b]c"' in text
    assert [t for t, special in turn.after if not special] == ["QRUNHIDDEN0X", "["]


def test_a_template_ignoring_tools_has_no_tools_turn(tiny: TransformersBackend) -> None:
    assert tools_turn(renderer(tiny, None), TOOLS, tiny.control_tokens) is None
    assert tiny.tools_turn(TOOLS) is None
    assert tiny.tool_call_format() is None
