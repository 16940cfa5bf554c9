"""Tool calls at run time (docs/language.md §7.7): the model's own call format around a tools=
hole (the text its chat template writes before and after the call's JSON, inserted as the
template's text, the JSON written under the constraint), the call's value with the default key
names, and the tools of `{% system tools=... %}` rendered into the turn: by the chat template
where it renders tools, else in qrun's documented default text."""

from __future__ import annotations

import json
from typing import Any

from qrun.backends.base import Backend
from qrun.backends.chat_template import ToolCallFormat
from qrun.constraint.tools import CallKeys, Tool, ToolsError, openai_tools, read_tools
from qrun.errors import EvaluationError
from qrun.lang import ir
from qrun.source import Source, Span

Pieces = tuple[tuple[str, bool], ...]
"""Text pieces, each with whether it may spell control tokens (the template's own text)."""

# The default rendering of tools (a model whose chat template has none): appended to the
# system turn's content, as Qwen's and Hermes' templates append theirs.
DEFAULT_HEADER = ("\n\nYou can call these tools. To call one, answer with a JSON object "
                  '{"name": <the tool\'s name>, "arguments": <its arguments as a JSON object>}.'
                  "\nTools:")


def call_format(backend: Backend, op: ir.Gen) -> ToolCallFormat | None:
    """The model's own format of a tools= hole's call, or None (not a tools= hole, or the
    model's chat template has none: the JSON object alone)."""
    if not isinstance(op.params.constraint, ir.ToolCall):
        return None
    return backend.tool_call_format()


def call_value(value: Any, keys: CallKeys) -> dict[str, Any]:
    """A call as the template reads it, `{"name": str, "arguments": dict}`, from the object
    the model wrote with its own key names (the constraint guarantees both keys)."""
    return {"name": value[keys.name], "arguments": value[keys.arguments]}


def checked_tools(value: Any, where: Span, source: Source) -> tuple[Tool, ...]:
    """The tools of a `{% system tools=... %}` value.

    Raises:
        EvaluationError: the value is not a list of tools (with the JSON pointer at fault).
    """
    try:
        return read_tools(value)
    except ToolsError as error:
        raise EvaluationError(str(error), where, source) from None


def system_pieces(backend: Backend, tools: tuple[Tool, ...],
                  markers: tuple[str, str]) -> tuple[Pieces, Pieces]:
    """What a system turn with tools puts before and after its content: the chat template's
    own rendering where it renders tools, else the turn's markers with the default text
    (DEFAULT_HEADER, then per tool its name, description and parameters) after the content.
    The tools' text is data either way: a description's `<|im_end|>` stays characters."""
    turn = backend.tools_turn(openai_tools(tools))
    if turn is not None:
        return turn.before, turn.after
    before, after = markers
    return ((before, True),), ((default_text(tools), False), (after, True))


def default_text(tools: tuple[Tool, ...]) -> str:
    """The default rendering of tools: the header, then one line per tool
    (`- name: description Parameters: {JSON Schema}`)."""
    lines = [DEFAULT_HEADER]
    for tool in tools:
        described = f" {tool.description}" if tool.description else ""
        schema = json.dumps(tool.parameters, ensure_ascii=False)
        lines.append(f"- {tool.name}:{described} Parameters: {schema}")
    return "\n".join(lines)
