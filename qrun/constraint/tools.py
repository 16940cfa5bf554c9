"""Tool calls (`{{ gen NAME tools=TOOLS }}`, docs/language.md §7.7): a list of tools in OpenAI's
function format read and checked (names distinct, parameters a JSON Schema of an object), and the
JSON Schema of one call to one of them, `{"name": <one of the names>, "arguments": <that tool's
parameters>}`, an `anyOf` with one branch per tool. Lowering it is spec.py's (`lower("tools",
...)`, as a json= schema is, so llguidance writes it and every call is valid): this module sits
below spec.py, which reads it. Free of models: the key names and their order come from the caller
(the model's own tool-call format, backends/chat_template.py, or the default `name` then
`arguments`)."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from qrun.constraint.grammar.schema import escape, schema_positions
from qrun.constraint.grammar.text import JsonFormat, json_rule

__all__ = ["CallKeys", "DEFAULT_KEYS", "Tool", "ToolsError", "call_schema", "openai_tools",
           "pointer_inside", "read_tools", "text_or_call_grammar"]

# OpenAI's rule for a function name (the API refuses others); it also keeps a name plain text
# wherever a chat template writes it unquoted (Qwen's writes `{"name": "` + name + `"`).
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A tool without `parameters` takes none (OpenAI's reading): its arguments are `{}`.
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {},
                                  "additionalProperties": False}
_POINTER_AT = re.compile(r" \(at (/[^)]*)\)$")


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool: its `name`, `description` ("" when none), `parameters` (a JSON Schema of an
    object: `type` is "object" or added) and where those parameters are in the list the user
    gave (`pointer`, a JSON pointer such as "/1/function/parameters")."""

    name: str
    description: str
    parameters: dict[str, Any]
    pointer: str


@dataclass(frozen=True, slots=True)
class CallKeys:
    """How a call object is written: the key of the tool's name, the key of its arguments, and
    whether the name comes first (`{"name": ..., "arguments": ...}`)."""

    name: str = "name"
    arguments: str = "arguments"
    name_first: bool = True

    def __post_init__(self) -> None:
        assert self.name != self.arguments, "a call's two keys differ"


DEFAULT_KEYS = CallKeys()


class ToolsError(ValueError):
    """Why a value is not a list of tools: `message`, and `pointer`, the JSON pointer of the
    part at fault in the list ("" for the list itself)."""

    def __init__(self, message: str, pointer: str = "") -> None:
        super().__init__(f"tools: {message} (at {pointer})" if pointer else message)
        self.message = message
        self.pointer = pointer


def read_tools(value: Any) -> tuple[Tool, ...]:
    """The tools of a list in OpenAI's function format: each item `{"type": "function",
    "function": {"name", "description", "parameters"}}` or the inner object alone.

    Raises:
        ToolsError: not a non-empty list of such tools, a name repeats or breaks OpenAI's rule
            (1-64 letters, digits, `_` or `-`), or parameters are not an object schema.
    """
    if not isinstance(value, list | tuple) or not value:
        raise ToolsError("tools must be a non-empty list of tools "
                         '({"type": "function", "function": {"name": ..., "parameters": ...}})')
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    for index, item in enumerate(value):
        tool = _read_tool(item, f"/{index}")
        if tool.name in seen:
            raise ToolsError(f'tool name "{tool.name}" repeats (first at {seen[tool.name]})',
                             tool.pointer.rsplit("/", 1)[0] + "/name")
        seen[tool.name] = tool.pointer.rsplit("/", 1)[0] + "/name"
        tools.append(tool)
    return tuple(tools)


def _read_tool(item: Any, at: str) -> Tool:
    if not isinstance(item, dict):
        raise ToolsError("a tool is an object", at)
    if "function" in item or "type" in item:
        if item.get("type", "function") != "function":
            raise ToolsError('a tool\'s "type" is "function"', f"{at}/type")
        item, at = item.get("function"), f"{at}/function"
        if not isinstance(item, dict):
            raise ToolsError('"function" is an object with the tool\'s name and parameters', at)
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolsError("a tool's name is 1 to 64 letters, digits, '_' or '-', got "
                         f"{json.dumps(name, ensure_ascii=False)[:40]}", f"{at}/name")
    description = item.get("description", "")
    if not isinstance(description, str):
        raise ToolsError("a tool's description is a string", f"{at}/description")
    parameters = item.get("parameters", _NO_PARAMETERS)
    if not isinstance(parameters, dict):
        raise ToolsError("a tool's parameters are a JSON Schema object", f"{at}/parameters")
    if "type" not in parameters:
        parameters = {"type": "object", **parameters}
    elif parameters["type"] != "object":
        raise ToolsError('a tool\'s parameters describe an object (type "object"): the '
                         "arguments are keyword arguments", f"{at}/parameters/type")
    return Tool(name, description, parameters, f"{at}/parameters")


def openai_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    """The tools in OpenAI's full form, as chat templates read them (`tools=` of
    transformers' apply_chat_template)."""
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = tool.parameters
        out.append({"type": "function", "function": function})
    return out


def call_schema(tools: tuple[Tool, ...], keys: CallKeys = DEFAULT_KEYS) -> dict[str, Any]:
    """The JSON Schema of one call: an `anyOf` with one closed object per tool, its two
    properties in the order `keys` gives, the name a `const`. A tool's local `$ref`s are
    rewritten to point into its branch (`#/$defs/a` -> `#/anyOf/1/properties/arguments/$defs/a`)
    and a `$schema` it declares moves to the root (the first one declared wins)."""
    branches = []
    root: dict[str, Any] = {}
    for index, tool in enumerate(tools):
        parameters = copy.deepcopy(tool.parameters)
        declared = parameters.pop("$schema", None)
        if isinstance(declared, str) and "$schema" not in root:
            root["$schema"] = declared
        base = f"/anyOf/{index}/properties/{escape(keys.arguments)}"
        for _, sub in schema_positions(parameters):
            ref = sub.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                sub["$ref"] = "#" + base + ref[1:]
        pairs = [(keys.name, {"const": tool.name}), (keys.arguments, parameters)]
        if not keys.name_first:
            pairs.reverse()
        branches.append({"type": "object", "properties": dict(pairs),
                         "required": [k for k, _ in pairs], "additionalProperties": False})
    return {**root, "anyOf": branches}


def text_or_call_grammar(tools: tuple[Tool, ...], fmt: JsonFormat) -> str:
    """The Lark grammar of an answer that is either text or one call to one of `tools` as the
    default JSON object (call_schema, in `fmt`): OpenAI's `tool_choice: "auto"`, where the model
    chooses. Text may not begin with `{` and a call does, so the answer's first byte says which
    it is (llguidance's own function-calling example, in its Lark syntax guide)."""
    return ("start: TEXT | call\n"
            "TEXT: /[^{][\\s\\S]*/\n"
            f"call: {json_rule(call_schema(tools), fmt)}\n")


def pointer_inside(message: str, base: str) -> str:
    """A schema error's JSON pointer (`... (at /properties/x)`) as a pointer into the tools
    list (`... (at /0/function/parameters/properties/x)`), `base` being the tool's
    `pointer`."""
    return _POINTER_AT.sub(lambda m: f" (at {base}{m.group(1).rstrip('/')})", message)
