"""Tools in qrun serve's OpenAI chat requests (docs/serve.md §2.7): `tools` and `tool_choice`
read into CHAT's inputs, the conversation's earlier calls and their results as the text the model
reads, and an answer under `tool_choice: "auto"` told apart into text or a call.

Every call is written under a constraint (a `tools=` hole; for "auto" a grammar whose call
branch is the same call schema, or, where the model writes calls in a format of its own, a
`json=` hole under it after the format's prefix: qrun/constraint/tools.py, serve/openai.py
chat_template), so a returned call always parses and names a tool with valid arguments. A
format's prefix and suffix (Qwen's `<tool_call>`, control tokens a request's text must never
spell) are CHAT's own text, never the request's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qrun.constraint import JsonFormat, LoweringError, lower
from qrun.constraint.tools import (
    DEFAULT_KEYS,
    CallKeys,
    Tool,
    call_schema,
    read_tools,
    text_or_call_grammar,
)
from qrun.serve.openai_errors import OpenAIError, bad

CALL_FORMAT = JsonFormat(closed=True, formats="known")
"""How a call's arguments are read: closed (a tool takes no keyword it does not name, as a
`tools=` hole) and known formats asserted, unknown ones annotations (as response_format's
schemas: they come from the same generators)."""


def tools_of(body: Mapping[str, Any], own_keys: CallKeys | None) -> dict[str, Any] | None:
    """CHAT's inputs for `tools` and `tool_choice`: the tools rendered in the system turn in
    the model's own format (docs/language.md §7.7); with `required` or a named function the
    answer is one call (a `tools=` hole: a tool's name and arguments valid under its
    parameters); `none` answers text; `auto` (the default with tools) lets the model choose
    between text and a call: a `grammar=` hole (text_or_call_grammar), or where the model
    writes calls in a format of its own (`own_keys`: its call object's keys), text that ends
    where the model begins the format's prefix, then the call under `call_schema`
    (serve/openai.py chat_template)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none"):
            raise bad("tool_choice: there are no tools", "tool_choice")
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type", "function") == "function"
            and isinstance(t.get("function"), dict) for t in tools):
        raise bad("tools: must be a list of {\"type\": \"function\", \"function\": {...}}",
                  "tools")
    names = [t["function"].get("name") for t in tools]
    if choice == "none":
        return {"tools": tools}
    if choice == "required":
        return {"tools": tools, "calls": tools, "kind": "tool"}
    if isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise bad(f"tool_choice: no tool named {json.dumps(name)[:60]}", "tool_choice")
        return {"tools": tools, "calls": [t for t in tools if t["function"]["name"] == name],
                "kind": "tool"}
    if choice in (None, "auto"):
        if own_keys is not None:
            return {"tools": tools, "call_schema": own_call_schema(tools, own_keys),
                    "kind": "auto"}
        return {"tools": tools, "grammar": auto_grammar(tools), "kind": "auto"}
    raise bad("tool_choice: must be \"auto\", \"none\", \"required\" or a named function",
              "tool_choice")


def auto_grammar(tools: list[Any]) -> str:
    """The grammar of an answer under `tool_choice: "auto"`, after the tools are checked as a
    `tools=` hole checks them (a refusal names the tool and points into the list).

    Raises:
        OpenAIError: 400 `invalid_constraint`, param `tools`.
    """
    grammar = text_or_call_grammar(checked_tools(tools, DEFAULT_KEYS), CALL_FORMAT)
    try:  # the whole grammar has bounds of its own (a thousand tools pass one by one)
        lower("grammar", grammar)
    except LoweringError as error:
        raise OpenAIError(400, "invalid_constraint", "tools: as tool_choice \"auto\"'s grammar "
                          f"(text, or a call to one of them): {error.message}", "tools") from None
    return grammar


def own_call_schema(tools: list[Any], keys: CallKeys) -> dict[str, Any]:
    """The schema of one call to one of `tools` with the model's own keys (a `json=` hole
    writes it, closed as a `tools=` hole's), after the tools are checked as a `tools=` hole
    checks them.

    Raises:
        OpenAIError: 400 `invalid_constraint`, param `tools`.
    """
    return call_schema(checked_tools(tools, keys), keys)


def checked_tools(tools: list[Any], keys: CallKeys) -> tuple[Tool, ...]:
    """`tools` read, after they are checked as a `tools=` hole writing calls with `keys`
    checks them (constraint/spec.py: a refusal names the tool and points into the list).

    Raises:
        OpenAIError: 400 `invalid_constraint`, param `tools`.
    """
    try:
        lower("tools", tools, CALL_FORMAT, keys=keys)
    except LoweringError as error:
        raise OpenAIError(400, "invalid_constraint", f"tools: {error.message}", "tools") from None
    return read_tools(tools)  # lowering read them already: they read


def answer_of(text: str) -> tuple[str | None, dict[str, Any] | None]:
    """An answer under "auto" as (content, call): a call where it begins with `{` (its
    grammar lets text begin with anything else), as the `tools=` value
    `{"name", "arguments"}`."""
    if not text.startswith("{"):
        return text, None
    value = json.loads(text)
    return None, {"name": value["name"], "arguments": value["arguments"]}


def assistant_calls(message: Mapping[str, Any], where: str,
                    keys: CallKeys = DEFAULT_KEYS) -> list[str]:
    """An assistant message's `tool_calls` as the model wrote them, each the JSON object with
    the model's keys (`keys`), each checked: a function call with a name and arguments that
    are a JSON object in a string (as OpenAI sends them back)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise bad(f"{where}.tool_calls: must be a non-empty list", f"{where}.tool_calls")
    lines = []
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            raise bad(f"{at}: must be {{\"type\": \"function\", \"function\": {{\"name\", "
                      "\"arguments\"}}}", at)
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise bad(f"{at}.function.arguments: must be a JSON object in a string",
                      f"{at}.function.arguments")
        pairs = [(keys.name, function["name"]), (keys.arguments, arguments)]
        lines.append(json.dumps(dict(pairs if keys.name_first else pairs[::-1]),
                                ensure_ascii=False))
    return lines


def call_names(message: Mapping[str, Any]) -> dict[str, str]:
    """The function name of each call an assistant message made, by its id."""
    names = {}
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict) and isinstance(call.get("id"), str) \
                and isinstance(call.get("function"), dict):
            names[call["id"]] = str(call["function"].get("name"))
    return names


def tool_result(message: Mapping[str, Any], content: str, names: Mapping[str, str],
                where: str) -> str:
    """A `tool` message as the user turn the model reads: `Result of NAME: CONTENT`, NAME the
    function of the earlier call its `tool_call_id` answers (one that answers no call is a
    400, as OpenAI's)."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in names:
        raise bad(f"{where}.tool_call_id: must be the id of an earlier assistant message's "
                  "tool call", f"{where}.tool_call_id")
    return f"Result of {names[call_id]}: {content}"
