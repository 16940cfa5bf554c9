"""The wire protocol of qrun serve's OpenAI endpoints (serve/openai.py, docs/serve.md §2.7):
a chat or completion request's body read and checked into a ChatCall (CHAT's or COMPLETE's
inputs and the run's options), the fields taken, let be or refused, and errors in OpenAI's
shape; nothing here runs anything (as serve/protocol.py for the template endpoints)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qrun.constraint.tools import DEFAULT_KEYS, CallKeys
from qrun.errors import UsageError
from qrun.options import SAMPLING_OPTIONS, RunOptions
from qrun.serve.openai_errors import bad
from qrun.serve.openai_tools import assistant_calls, call_names, tool_result, tools_of
from qrun.serve.protocol import ApiError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "user"}
"""The message roles taken, and the chat role each is rendered as (`developer` is OpenAI's
newer name for `system`; a `tool` message, a call's result, is what the user side says)."""

DEFAULT_MAX_TOKENS = 512
"""An answer's length when the request names none (OpenAI's default is the rest of the
context; a bound keeps a request without one from holding a slot that long)."""

TOP_LOGPROBS = 5
"""The most alternatives per token `top_logprobs` may ask for: those a run's trace keeps
(runtime/recorder.py TOP_ALTERNATIVES)."""

MAX_N = 16
"""The most choices one request may ask for (`n`): each is a branch of the run."""

DEFAULT_TEMPERATURE = 1.0
"""OpenAI's default: a request without `temperature` samples, as it would elsewhere."""

IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls",
                     "reasoning_effort", "prediction", "modalities",
                     "web_search_options", "safety_identifier", "prompt_cache_key"})
"""Fields that change nothing about the answer's text here (who asked, what to keep, how to
bill): read and let be, as OpenAI's own server does for features a model lacks."""

UNSUPPORTED = {
    "functions": "function calls (use tools)",
    "function_call": "function calls", "audio": "audio",
}
"""Fields qrun serve does not answer yet (issue #39's next steps), each refused when it asks
for something (a 400 naming it) rather than answered as if it were not there; their neutral
values (false, 0, none, an empty list) pass."""

CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar", "structured_outputs")

CHAT_KNOWN = frozenset({"model", "messages", *SAMPLING_OPTIONS, "seed", "max_tokens",
                        "max_completion_tokens", "stop", "n", "stream", "stream_options",
                        "tools", "tool_choice", "logprobs", "top_logprobs",
                        *CONSTRAINT_FIELDS, *IGNORED, *UNSUPPORTED})

LEGACY_UNSUPPORTED = {"suffix": "suffixes (text to insert before)"}
"""What /v1/completions adds to UNSUPPORTED, with the value of each that asks for nothing."""
LEGACY_NEUTRAL = {"suffix": ""}

LEGACY_KNOWN = (CHAT_KNOWN - {"messages", "max_completion_tokens", "top_logprobs",
                              "tools", "tool_choice", "functions", "function_call", "audio",
                              "response_format", "parallel_tool_calls", "modalities",
                              "reasoning_effort", "prediction", "web_search_options"}
                ) | {"prompt", "echo", "best_of"}
"""The fields /v1/completions reads: a prompt instead of messages, vLLM's constraint fields
but no response_format (as vLLM's own completions endpoint)."""


@dataclass(frozen=True)
class ChatCall:
    """A checked chat request: CHAT's inputs and the run's options."""

    model: str
    inputs: dict[str, Any]
    options: RunOptions
    constraint_field: str | None  # the field the constraint came in
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    logprobs: int | None = None  # how many alternatives each answer token lists, if any
    legacy: bool = False  # POST /v1/completions: a prompt in, text_completion objects out
    echo: bool = False  # /v1/completions' echo: each choice's text is the prompt, then its own
    n: int = 1  # the choices answered: the likeliest n of the count run (best_of), else all
    own_keys: CallKeys | None = None  # the model's call keys, where its format is its own


def neutral(key: str, value: Any) -> bool:
    """Whether a field's value asks for nothing (absent, off, empty; `n` of 1)."""
    if key == "n":
        return value is None or (type(value) is int and value == 1)
    return value is None or value is False or value == [] or value == {}


def inputs_from_messages(messages: Any) -> Any:
    """A template's inputs from a chat: the last user message's content, a JSON object."""
    last = next((m for m in reversed(messages_of(messages)) if m["role"] == "user"), None)
    if last is None:
        raise bad("messages: a template takes its inputs from the last user message (a JSON "
                  "object) or from `inputs`", "messages")
    try:
        return json.loads(last["content"])
    except ValueError:
        raise bad("messages: the last user message must be the template's inputs as a JSON "
                  "object (or give `inputs`)", "messages") from None


def chat_call(body: Any, served: str, legacy: bool = False, own_keys: CallKeys | None = None
              ) -> ChatCall:
    """A chat request's body (with `legacy`, a completion request's), checked (400 with
    OpenAI's `param` where a field is wrong, 404 for another model). `own_keys`: the served
    model writes tool calls in a format of its own, its call object with these keys
    (serve/openai_tools.py)."""
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    if legacy:
        for key, what in LEGACY_UNSUPPORTED.items():
            value = body.get(key)
            if value is not None and (type(value) is not type(LEGACY_NEUTRAL[key])
                                      or value != LEGACY_NEUTRAL[key]):
                raise bad(f"{key}: {what} are not supported by qrun serve yet", key)
        body = {k: v for k, v in body.items() if k not in LEGACY_UNSUPPORTED}
    unknown = sorted(set(body) - (LEGACY_KNOWN if legacy else CHAT_KNOWN))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(map(repr, unknown))}", unknown[0])
    for key, what in UNSUPPORTED.items():
        value = body.get(key)
        if not neutral(key, value) and not (type(value) in (int, float) and value == 0):
            raise bad(f"{key}: {what} are not supported by qrun serve yet", key)
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model: required, a string", "model")
    if model != served:
        raise ApiError(404, "model_not_found", f"the model {model[:100]!r} does not exist: "
                       f"this server serves {served!r} (GET /v1/models)")
    n = 1 if body.get("n") is None else body["n"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise bad(f"n: must be an integer from 1 to {MAX_N}", "n")
    echo, best_of = (legacy_extras(body, n) if legacy else (False, n))
    given = {"prompt": prompt_of(body.get("prompt"))} if legacy else {
        "messages": messages_of(body.get("messages"), own_keys)}
    inputs: dict[str, Any] = {**given, "count": best_of,
                              "limit": max_tokens_of(body), "stop": stop_of(body.get("stop")),
                              "schema": None, "pattern": None, "grammar": None,
                              "choices": None, "kind": "text", "tools": None, "calls": None,
                              "call_schema": None}
    field, constraint = constraint_of(body)
    inputs.update(constraint)
    if not legacy:
        tools = tools_of(body, own_keys)
        if tools is not None:
            if field is not None and tools.get("kind") in ("tool", "auto"):
                raise bad(f"{field} and a tool call: give one (tool_choice \"none\" answers "
                          "under the constraint)", field)
            inputs.update(tools)
        if own_keys is not None and inputs["kind"] == "auto":
            # The answer is two holes, text then maybe a call (serve/openai.py chat_template).
            for key, asked in (("n", n > 1), ("stop", inputs["stop"]),
                               ("logprobs", body.get("logprobs"))):
                if asked:
                    raise bad(f"{key}: with tool_choice \"auto\" on a model whose tool calls "
                              "have a format of their own, not supported by qrun serve yet",
                              key)
    logprobs = legacy_logprobs_of(body, best_of) if legacy else logprobs_of(body, n)
    if echo and logprobs is not None:
        raise bad("echo: with logprobs, not supported by qrun serve yet (the prompt's tokens "
                  "are fed, not sampled: no log-probabilities are kept for them)", "echo")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("stream: must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False),
                                                         bool):
        raise bad("stream_options: must be an object with include_usage true or false",
                  "stream_options")
    sampling = sampling_of(body)
    if inputs["kind"] == "choice":
        for key, off in TOKEN_OPTIONS.items():
            if getattr(sampling, key) not in (None, off):
                raise bad(f"{key}: a choice is scored whole (each option's probability), not "
                          "sampled token by token; give it with guided_regex instead", key)
    if logprobs is not None:  # the trace keeps each sampled token's alternatives
        sampling = RunOptions(trace=True).over(sampling)
    return ChatCall(model, inputs, sampling, field, stream,
                    bool(options.get("include_usage")), legacy=legacy, logprobs=logprobs,
                    echo=echo, n=n, own_keys=own_keys)


def legacy_extras(body: Mapping[str, Any], n: int) -> tuple[bool, int]:
    """/v1/completions' `echo` (true or false) and `best_of` (n to MAX_N, n by default; not
    streamed, as OpenAI's)."""
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise bad("echo: must be true or false", "echo")
    best_of = n if body.get("best_of") is None else body["best_of"]
    if isinstance(best_of, bool) or not isinstance(best_of, int) \
            or not n <= best_of <= MAX_N:
        raise bad(f"best_of: must be an integer from n ({n}) to {MAX_N}", "best_of")
    if best_of > n and body.get("stream"):
        raise bad("best_of: not with stream (the best answers are known only at the end)",
                  "best_of")
    return bool(echo), best_of


def legacy_logprobs_of(body: Mapping[str, Any], n: int) -> int | None:
    """/v1/completions' `logprobs`: how many alternatives each token lists (0 to
    TOP_LOGPROBS), or None."""
    top = body.get("logprobs")
    return None if top is None else _alternatives(top, "logprobs", body, n)


def logprobs_of(body: Mapping[str, Any], n: int) -> int | None:
    """How many alternatives each answer token lists (`top_logprobs`, 0 to TOP_LOGPROBS)
    when `logprobs` is true, else None."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is None or asked is False:
        if top not in (None, 0) or isinstance(top, bool):
            raise bad("top_logprobs: needs logprobs true", "top_logprobs")
        return None
    if asked is not True:
        raise bad("logprobs: must be true or false", "logprobs")
    return _alternatives(0 if top is None else top, "top_logprobs", body, n)


def _alternatives(top: Any, key: str, body: Mapping[str, Any], n: int) -> int:
    """`top`, the request's field `key`, checked as a count of alternatives per token, for a
    request of one choice (the trace keeps the run's own tokens, not its branches')."""
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= TOP_LOGPROBS:
        raise bad(f"{key}: must be an integer from 0 to {TOP_LOGPROBS} (the alternatives "
                  "qrun keeps per token)", key)
    if n > 1:
        raise bad("logprobs: with n > 1 (or best_of > 1), not supported by qrun serve yet",
                  "logprobs")
    return top


def prompt_of(prompt: Any) -> str:
    """A completion request's prompt: a string, or a list of one."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt: must be a string (token ids and several prompts are not supported "
                  "by qrun serve yet)", "prompt")
    return prompt


def messages_of(given: Any, own_keys: CallKeys | None = None) -> list[dict[str, Any]]:
    """The conversation as CHAT renders it, each message a chat role, its text and its calls:
    an assistant message's `tool_calls` follow its text as the model writes calls (in the
    text, one JSON object a line; where the model has a format of its own, `own_keys`, as
    `calls`, which CHAT writes between the format's prefix and suffix), and a `tool` message (a
    call's result) is a user turn (serve/openai_tools.py)."""
    if not isinstance(given, list) or not given:
        raise bad("messages: required, a non-empty list", "messages")
    messages = []
    names: dict[str, str] = {}  # the calls made so far: their function names by id
    for k, message in enumerate(given):
        where = f"messages[{k}]"
        if not isinstance(message, dict):
            raise bad(f"{where}: must be an object with a role and content", where)
        role = message.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role: must be one of {', '.join(ROLES)} (got "
                      f"{json.dumps(role)[:40]})", f"{where}.role")
        calls = role == "assistant" and message.get("tool_calls") not in (None, [])
        content = message.get("content")
        text = "" if content is None and calls else content_of(content, f"{where}.content")
        made: list[str] = []
        if calls:
            made = assistant_calls(message, where, own_keys or DEFAULT_KEYS)
            names.update(call_names(message))
            if own_keys is None:
                text, made = "\n".join(part for part in (text, *made) if part), []
        elif role == "tool":
            text = tool_result(message, text, names, where)
        messages.append({"role": ROLES[role], "content": text, "calls": made})
    return messages


def content_of(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise bad(f"{where}: only text parts are supported", where)
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}: must be a string or a list of text parts", where)


def max_tokens_of(body: Mapping[str, Any]) -> int:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    value = body.get(key)
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(f"{key}: must be a positive integer", key)
    return value


def stop_of(stop: Any) -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > 16:
        raise bad("stop: must be a non-empty string or a list of at most 16", "stop")
    return stops or None


def sampling_of(body: Mapping[str, Any], temperature: float | None = DEFAULT_TEMPERATURE
                ) -> RunOptions:
    """The request's sampling fields as run options (`temperature` where it gives none: a
    template's own default with None), each checked (400 naming it)."""
    given = {key: body[key] for key in (*SAMPLING_OPTIONS, "seed")
             if body.get(key) is not None}
    if temperature is not None:
        given.setdefault("temperature", temperature)
    for key, value in given.items():
        if key != "logit_bias" and (isinstance(value, bool)
                                    or not isinstance(value, int | float)):
            raise bad(f"{key}: must be a number", key)
    if not 0 <= given.get("temperature", 0) <= 2:
        raise bad("temperature: must be between 0 and 2", "temperature")
    try:
        return RunOptions(**given)
    except UsageError as exc:  # a value out of range, said in RunOptions' words
        raise bad(str(exc), option_named(str(exc))) from None


def option_named(message: str) -> str | None:
    """The sampling option a run option's error is about (its messages begin with the
    option's name: qrun/options.py), as OpenAI's `param`."""
    return next((key for key in (*SAMPLING_OPTIONS, "seed") if message.startswith(key + " ")),
                None)


TOKEN_OPTIONS: Mapping[str, Any] = {
    "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "repetition_penalty": 1.0, "logit_bias": {}}
"""The sampling fields that act on tokens as they are sampled, which a guided choice (scored
whole, as a `select`) has none of, with the value of each that does nothing."""


def constraint_of(body: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The field of the request's constraint and CHAT's inputs for it: `response_format`,
    vLLM's `guided_*` fields or its `structured_outputs` object (json, regex, choice,
    grammar); at most one."""
    given = [key for key in CONSTRAINT_FIELDS if body.get(key) is not None]
    formats = body.get("response_format")
    if isinstance(formats, dict) and formats.get("type") == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise bad(f"{' and '.join(given)}: give one constraint", given[1])
    if not given:
        return None, {}
    field = key = given[0]
    return field, _constraint(key, body[key])


def _constraint(key: str, value: Any) -> dict[str, Any]:
    if key == "response_format":
        return _response_format(value)
    if key == "structured_outputs":
        if not isinstance(value, dict) or len(value) != 1:
            raise bad("structured_outputs: must hold one of json, regex, choice, grammar", key)
        (kind, value), = value.items()
        key = f"guided_{kind}"
    if key == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad(f"{key}: not a JSON schema", key) from None
        if not isinstance(value, dict | bool):
            raise bad(f"{key}: must be a JSON schema", key)
        return {"kind": "json", "schema": value}
    if key == "guided_regex" and isinstance(value, str) and value:
        return {"kind": "regex", "pattern": value}
    if key == "guided_grammar" and isinstance(value, str) and value:
        return {"kind": "grammar", "grammar": value}
    if key == "guided_choice" and isinstance(value, list) and value \
            and all(isinstance(v, str) and v for v in value):
        return {"kind": "choice", "choices": value}
    raise bad(f"{key}: not a constraint qrun takes (json: a schema, regex and grammar: a "
              "string, choice: a list of strings)", key)


def _response_format(value: Any) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return {"kind": "json", "schema": {"type": "object"}}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict | bool):
            raise bad("response_format.json_schema.schema: required, a JSON schema",
                      "response_format")
        return {"kind": "json", "schema": schema}
    raise bad("response_format.type: must be text, json_object or json_schema",
              "response_format")
