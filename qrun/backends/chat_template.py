"""What the runtime reads from a model's chat template (a Jinja text shipped with the model), in
one place for every backend: a role's markers (docs/language.md §11), the model's own tool-call
format, and a system turn with tools rendered in (docs/language.md §7.7). Each backend only
renders messages (transformers' apply_chat_template, vLLM's tokenizer, or llama.cpp's GGUF
template in a sandboxed Jinja): it passes its `Render`, and the probing here is the same for
all."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from qrun.constraint.tools import CallKeys

__all__ = ["Render", "ToolCallFormat", "ToolTurn", "role_markers", "tool_call_format",
           "tools_turn"]

Render = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], str]
"""A backend's rendering of `messages` with its chat template, with `tools` (OpenAI's function
format) when given, no generation prompt. It may raise whatever the template raises."""

# A text no chat template would contain, used to cut a rendered message into its markers.
SENTINEL = "\x00QRUN-CONTENT\x00"
# The call rendered to find the model's tool-call format: names and values no template writes.
_PROBE_NAME = "qrun_probe_tool"
_PROBE_ARGUMENTS = {"qrun_probe_argument": "qrun probe value"}
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_NAME, "description": "probe",
    "parameters": {"type": "object", "properties": {"qrun_probe_argument": {"type": "string"}},
                   "required": ["qrun_probe_argument"]}}}]


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How a model writes a tool call, read from its chat template: the text before the call's
    JSON object (`prefix`, Qwen's and Hermes' `<tool_call>\\n`), the text after it (`suffix`,
    `\\n</tool_call>`), both inside the assistant turn, and the object's two keys."""

    prefix: str
    suffix: str
    keys: CallKeys


@dataclass(frozen=True, slots=True)
class ToolTurn:
    """A system turn with tools as the chat template renders it, around the turn's content:
    pieces of text, each with whether it is the template's own (True: may spell control
    tokens) or the tools' data (False: always text, so a description's `<|im_end|>` stays
    characters)."""

    before: tuple[tuple[str, bool], ...]
    after: tuple[tuple[str, bool], ...]


def role_markers(render: Render, role: str) -> tuple[str, str] | None:
    """The text the template puts before and after a `role` message's content, or None where
    it cannot be cut out (the template refuses the role, or rewrites the content)."""
    # Some templates (SmolLM2's among them) add a default system turn before the first
    # message; rendering after an explicit system turn and subtracting it leaves only this
    # role's own markers.
    base = [{"role": "system", "content": "S"}] if role != "system" else []
    try:
        before = render(base, None) if base else ""
        rendered = render([*base, {"role": role, "content": SENTINEL}], None)
    except Exception:  # noqa: BLE001 - a template's own error means: no markers for this role
        return None
    if not rendered.startswith(before) or SENTINEL not in rendered:
        return None
    prefix, _, suffix = rendered[len(before):].partition(SENTINEL)
    return prefix, suffix


def tool_call_format(render: Render) -> ToolCallFormat | None:
    """The model's tool-call format: a probe conversation whose assistant message has one
    tool call is rendered, and the call's JSON object located in that turn (the first object
    whose two keys hold the probe's name and its arguments object). None where the template
    writes no tool calls, writes arguments as a JSON string, adds keys (an id), or puts the
    call outside the assistant turn's markers: the default JSON object applies then."""
    markers = role_markers(render, "assistant")
    if markers is None:
        return None
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "type": "function", "id": "call_0",
        "function": {"name": _PROBE_NAME, "arguments": _PROBE_ARGUMENTS}}]}
    try:
        before = render(base, _PROBE_TOOLS)
        rendered = render([*base, call], _PROBE_TOOLS)
    except Exception:  # noqa: BLE001 - a template that cannot render a call has no format
        return None
    opening, closing = markers
    turn = rendered[len(before):]
    if not rendered.startswith(before) or not turn.startswith(opening) or \
            not turn.endswith(closing) or len(turn) < len(opening) + len(closing):
        return None
    body = turn[len(opening):len(turn) - len(closing)]
    return _locate_call(body)


def _locate_call(body: str) -> ToolCallFormat | None:
    decoder = json.JSONDecoder()
    start = body.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(body, start)
        except ValueError:
            value, end = None, start
        if isinstance(value, dict) and len(value) == 2:
            names = [k for k, v in value.items() if v == _PROBE_NAME]
            arguments = [k for k, v in value.items() if v == _PROBE_ARGUMENTS]
            if names and arguments:
                keys = CallKeys(names[0], arguments[0], name_first=next(iter(value)) == names[0])
                return ToolCallFormat(body[:start], body[end:], keys)
        start = body.find("{", start + 1)
    return None


def tools_turn(render: Render, tools: list[dict[str, Any]],
               control_texts: Iterable[str]) -> ToolTurn | None:
    """The system turn with `tools` (OpenAI's full form) as the template renders them, or
    None where the template ignores tools (or fails with them). The tools are rendered with
    their text hidden where it could spell a control token (see _Hider), so the control
    tokens of the result are the template's own; the hidden text is then put back as data
    pieces."""
    hider = _Hider(control_texts)
    safe = _replace_strings(tools, hider.hide)
    try:
        plain = render([{"role": "system", "content": SENTINEL}], None)
        rendered = render([{"role": "system", "content": SENTINEL}], safe)
    except Exception:  # noqa: BLE001 - a template that fails with tools does not render them
        return None
    if rendered == plain or rendered.count(SENTINEL) != 1:
        return None
    before, after = rendered.split(SENTINEL)
    return ToolTurn(hider.pieces(before), hider.pieces(after))


class _Hider:
    """Hides the text of data that could begin a control token behind placeholders of
    letters and digits (which every escaping a template applies, `tojson` included, leaves
    as they are), and puts it back as data pieces. Every character that begins a control
    token and is no letter or digit (`<` for `<|im_end|>`, `[` for `[INST]`) is hidden, so
    no control token can start in the tools' text, even one the template would make by
    writing its text next to other text; a control token beginning with a letter or digit is
    hidden whole."""

    _MARK = re.compile(r"QRUNHIDDEN(\d+)X")

    def __init__(self, control_texts: Iterable[str]) -> None:
        controls = [t for t in control_texts if t]
        self.chars = "".join(sorted({t[0] for t in controls if not t[0].isalnum()}))
        self.words = sorted((t for t in controls if t[0].isalnum()), key=len, reverse=True)
        self.hidden: list[str] = []
        parts = [re.escape(w) for w in self.words]
        if self.chars:
            parts.append(f"[{re.escape(self.chars)}]")
        parts.append(self._MARK.pattern)  # the data's own look-alikes are hidden too
        self.pattern = re.compile("|".join(parts))

    def hide(self, text: str) -> str:
        return self.pattern.sub(self._mark, text)

    def _mark(self, found: re.Match[str]) -> str:
        self.hidden.append(found.group(0))
        return f"QRUNHIDDEN{len(self.hidden) - 1}X"

    def pieces(self, text: str) -> tuple[tuple[str, bool], ...]:
        """`text` cut at the placeholders: the template's text between them, the hidden
        text as data."""
        out: list[tuple[str, bool]] = []
        at = 0
        for found in self._MARK.finditer(text):
            index = int(found.group(1))
            if index >= len(self.hidden):
                continue  # cannot be: every mark in the data was hidden itself
            out += [(text[at:found.start()], True), (self.hidden[index], False)]
            at = found.end()
        out.append((text[at:], True))
        return tuple(p for p in out if p[0])


def _replace_strings(value: Any, change: Callable[[str], str]) -> Any:
    """A copy of JSON data with every string (keys too) passed through `change`."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {change(k) if isinstance(k, str) else k: _replace_strings(v, change)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_replace_strings(v, change) for v in value]
    return value
