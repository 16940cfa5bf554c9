"""OpenAI-compatible endpoints of `qrun serve` (docs/serve.md §2.7, issue #39): `GET
/v1/models`, `POST /v1/chat/completions` and `POST /v1/completions`, so the clients people
already use (the `openai` SDK and the libraries on it) reach qrun's masks. A request becomes a
run of one template, CHAT or COMPLETE, on the served model, through the same admission,
scheduler and metrics as the template endpoints: the messages or the prompt are its inputs
(rendered by the model's own chat template, never read as template text or control tokens),
and the answer is its one hole (or `n` holes in a fork), constrained by the request's
`response_format`, vLLM's `guided_*` / `structured_outputs` extensions or its tools, every
token masked by qrun. A served template is a model too (`template:NAME`). Errors take OpenAI's
shape (`{"error": {"message", "type", "param", "code"}}`), with the statuses the SDK maps to
its exception classes. What this does not do yet is refused with a 400 naming it, never
ignored (UNSUPPORTED)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from qrun.api import Query
from qrun.errors import RunCancelled, UsageError
from qrun.options import RunOptions
from qrun.serve.protocol import ApiError, check_input_sizes, read_json
from qrun.serve.service import Service, log
from qrun.serve.streams import outcome_of, submit, unless_abandoned

if TYPE_CHECKING:  # the runtime is reached through Query, never imported here
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result

ANSWER = """\
{%- if kind == "json" -%}{{ gen content json=schema formats="known" max_tokens=limit }}
{%- elif kind == "regex" -%}{{ gen content regex=pattern max_tokens=limit }}
{%- elif kind == "grammar" -%}{{ gen content grammar=grammar max_tokens=limit }}
{%- elif kind == "choice" -%}{{ select content options=choices }}
{%- elif kind == "tool" -%}{{ gen content tools=calls max_tokens=limit }}
{%- elif stop -%}{{ gen content stop=stop max_tokens=limit }}
{%- else -%}{{ gen content max_tokens=limit }}
{%- endif -%}"""

CHAT = """\
{%- if tools and messages[0].role != "system" -%}{% system tools=tools %}{% endsystem %}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == "system" and tools and loop.first -%}
{% system tools=tools %}{{ m.content }}{% endsystem %}
{%- elif m.role == "system" -%}{% system %}{{ m.content }}{% endsystem %}
{%- elif m.role == "user" -%}{% user %}{{ m.content }}{% enduser %}
{%- else -%}{% assistant %}{{ m.content }}{% endassistant %}
{%- endif -%}
{%- endfor -%}
{% assistant %}
{%- if count == 1 -%}""" + ANSWER + """
{%- else -%}{% fork i in range(count) %}""" + ANSWER + """{% endfork %}
{%- endif -%}
{% endassistant %}"""
"""The template every chat request runs: the messages in the model's chat format, then the
assistant's answer as one hole (ANSWER), or `count` (the request's `n`) answers as the
branches of a fork, which share the prompt fed once (docs/language.md §23.1). Formats a
schema does not know (OpenAPI's `int32`, `double`, `password`...) are annotations, as JSON
Schema says (`formats="known"`, docs/language.md §7.4): schemas arrive from pydantic and
OpenAPI generators."""

COMPLETE = """\
{{ prompt }}
{%- if count == 1 -%}""" + ANSWER + """
{%- else -%}{% fork i in range(count) %}""" + ANSWER + """{% endfork %}
{%- endif -%}"""
"""The template of `POST /v1/completions` (OpenAI's legacy text completions): the prompt as
text, never control tokens, then the answer as CHAT's."""

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
"""The message roles taken, and the chat role each is rendered as (`developer` is OpenAI's
newer name for `system`)."""

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
    "logit_bias": "logit_bias", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}
"""Fields qrun serve does not answer yet (issue #39's next steps), each refused when it asks
for something (a 400 naming it) rather than answered as if it were not there; their neutral
values (false, 0, none, an empty list) pass."""

CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar", "structured_outputs")

CHAT_KNOWN = frozenset({"model", "messages", "temperature", "top_p", "top_k", "seed",
                        "max_tokens", "max_completion_tokens", "stop", "n", "stream",
                        "stream_options", "tools", "tool_choice", "logprobs",
                        "top_logprobs", *CONSTRAINT_FIELDS, *IGNORED, *UNSUPPORTED})

LEGACY_UNSUPPORTED = {"echo": "echoed prompts", "suffix": "suffixes", "best_of": "best_of"}
"""What /v1/completions adds to UNSUPPORTED, with the value of each that asks for nothing."""
LEGACY_NEUTRAL = {"echo": False, "suffix": "", "best_of": 1}

LEGACY_KNOWN = (CHAT_KNOWN - {"messages", "max_completion_tokens", "top_logprobs",
                              "tools", "tool_choice", "functions", "function_call", "audio",
                              "response_format", "parallel_tool_calls", "modalities",
                              "reasoning_effort", "prediction", "web_search_options"}
                ) | {"prompt"}
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


def model_id(service: Service) -> str:
    """The id `/v1/models` lists for the served model, which requests name."""
    return service.backend.name


TEMPLATE_PREFIX = "template:"
"""A served template's model id is its name after this (`template:extract`)."""


async def list_models(service: Service, request: Request, request_id: str) -> Response:
    ids = [model_id(service), *(TEMPLATE_PREFIX + name for name in service.templates)]
    return JSONResponse({"object": "list", "data": [
        {"id": id_, "object": "model", "created": 0, "owned_by": "qrun"} for id_ in ids]})


async def chat_completions(service: Service, request: Request, request_id: str, *,
                           chat: Query, legacy: bool = False) -> Response:
    """POST /v1/chat/completions: the request run as `chat` (CHAT compiled once per app);
    with `legacy`, POST /v1/completions run as COMPLETE."""
    body = await read_json(request, service.limits)
    if not legacy and isinstance(body, dict) and isinstance(body.get("model"), str) \
            and body["model"].startswith(TEMPLATE_PREFIX):
        return await _run_template(service, request, request_id, body)
    call = chat_call(body, model_id(service), legacy)
    given = "prompt" if legacy else "messages"
    check_input_sizes({given: call.inputs[given]}, service.limits)
    run = chat.request(call.inputs, options=call.options)
    log.info("[%s] chat completion (%s%s)", request_id, call.inputs["kind"],
             ", streamed" if call.stream else "")
    if call.stream:
        return _stream(service, run, call, request_id)
    try:
        result = await outcome_of(service, request, submit(service, run), None, request_id)
    except ApiError as exc:
        raise _as_client_error(exc, call) from None
    return JSONResponse(completion(result, call, request_id))


async def _run_template(service: Service, request: Request, request_id: str,
                        body: dict[str, Any]) -> Response:
    """A chat request to `template:NAME`: the template run with the request's `inputs` (an
    object in the body, `extra_body` in the SDK) or else the last user message's content as a
    JSON object, the request's sampling options over the template's own; the answer is the
    typed output record (the template's `output:`, else its captures) as JSON."""
    name = body["model"][len(TEMPLATE_PREFIX):]
    query = service.templates.get(name)
    if query is None:
        raise ApiError(404, "model_not_found", f"no template named {name[:100]!r} is served "
                       "(GET /v1/models)")
    allowed = {"model", "messages", "inputs", "temperature", "top_p", "top_k", "seed",
               "max_tokens", "max_completion_tokens", *IGNORED}
    asked = sorted(key for key in set(body) - allowed
                   if key not in CHAT_KNOWN or not _neutral(key, body[key]))
    if asked:
        raise bad(f"{asked[0]}: not taken by a template (its holes have their own "
                  "constraints and options)", asked[0])
    inputs = body.get("inputs")
    if inputs is None:
        inputs = _inputs_from_messages(body.get("messages"))
    if not isinstance(inputs, dict):
        raise bad("inputs: must be a JSON object", "inputs")
    check_input_sizes(inputs, service.limits)
    options = {key: body[key] for key in ("temperature", "top_p", "top_k", "seed")
               if body.get(key) is not None}
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        options["max_tokens"] = max_tokens_of(body)
    try:
        run_options = RunOptions(**options)
    except UsageError as exc:
        raise bad(str(exc)) from None
    run = query.request(inputs, options=run_options)  # InputError: 422, as a template's run
    log.info("[%s] chat completion by template %s", request_id, name)
    result = await outcome_of(service, request, submit(service, run), None, request_id)
    answer = result.output if result.output is not None else result.vars
    stats = result.stats
    completion_tokens = stats.generated_tokens + stats.forced_tokens
    return JSONResponse({
        "id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()),
        "model": body["model"], "system_fingerprint": None,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "refusal": None,
                                 "content": json.dumps(answer, ensure_ascii=False)}}],
        "usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": stats.prompt_tokens + completion_tokens}})


def _neutral(key: str, value: Any) -> bool:
    """Whether a field's value asks for nothing (absent, off, empty; `n` of 1)."""
    if key == "n":
        return value is None or (type(value) is int and value == 1)
    return value is None or value is False or value == [] or value == {}


def _inputs_from_messages(messages: Any) -> Any:
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


def _as_client_error(error: ApiError, call: ChatCall) -> ApiError:
    """CHAT itself compiles and evaluates: an error of its text at run time is the request's
    constraint or tools (a schema, regex, grammar or tool list qrun refuses), answered as the
    client's mistake."""
    if error.code in ("template_error", "evaluation_error"):
        field = "tools" if call.inputs.get("tools") is not None else call.constraint_field
        return OpenAIError(400, "invalid_constraint", error.message, field)
    return error


def _stream(service: Service, run: RunRequest, call: ChatCall, request_id: str) -> Response:
    """Server-sent events in OpenAI's chunk format: the role, the answer's text as the model
    writes it (stop strings held back until they cannot be one), the finish reason, the usage
    (with stream_options.include_usage), `[DONE]`. A failure once the stream has begun is an
    `error` event (the SDK raises it)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def push(kind: str, data: Any) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (kind, data))

    ticket = submit(service, run.streaming(None, None, lambda name, text: push("text", text)))
    ticket.future.add_done_callback(lambda future: push("end", future))
    base = {"id": f"{'cmpl' if call.legacy else 'chatcmpl'}-{request_id}",
            "object": "text_completion" if call.legacy else "chat.completion.chunk",
            "created": int(time.time()), "model": call.model, "system_fingerprint": None}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        if call.legacy:
            choice = {"index": 0, "text": delta.get("content", ""), "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _event({**base, "choices": [choice]})

    async def produce() -> AsyncIterator[str]:
        try:
            if not call.legacy:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                try:
                    kind, data = await unless_abandoned(
                        service, asyncio.ensure_future(events.get()), None)
                except RunCancelled as exc:
                    yield _event(openai_error(service.failure(exc, request_id)))
                    return
                if kind == "text":
                    yield chunk({"content": data})
                    continue
                error = _ended(service, data, request_id)
                if error is not None:
                    yield _event(openai_error(_as_client_error(error, call)))
                    return
                answer = completion(data.result(), call, request_id)
                yield chunk({}, answer["choices"][0]["finish_reason"])
                if call.include_usage:
                    yield _event({**base, "choices": [], "usage": answer["usage"]})
                yield "data: [DONE]\n\n"
                return
        finally:
            ticket.cancel()  # a client gone away: the run stops at its next forward

    return StreamingResponse(produce(), media_type="text/event-stream",
                             headers={"X-Request-ID": request_id, "Cache-Control": "no-cache"})


def _ended(service: Service, future: Future[Any], request_id: str) -> ApiError | None:
    """Why the run of `future` (ended) has no result, or None when it has one."""
    if future.cancelled():
        return (service.failure(asyncio.CancelledError()) if service.abandoned
                else ApiError(503, "cancelled", "the run was cancelled"))
    exc = future.exception()
    if exc is None:
        return None
    error = service.failure(exc, request_id)
    if error.code == "internal_error":
        log.error("[%s] internal error", request_id, exc_info=exc)
    return error


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def completion(result: Result, call: ChatCall, request_id: str) -> dict[str, Any]:
    """The chat.completion object of a finished run. Usage counts tokens as the model read
    them: the prompt is every context position before the answer's first decision (the chat
    format's tokens included; fed once for all `n` choices), the completion every choice's
    tokens."""
    holes = (result.hole_lists["content"] if call.inputs["count"] > 1
             else [result.holes["content"]])
    choices, completion_tokens = [], 0
    for index, hole in enumerate(holes):
        # The first tokens may only re-produce prompt text that healing took back.
        completion_tokens += len(hole.token_ids) - getattr(hole, "prefix_tokens", 0)
        choice: dict[str, Any] = {
            "index": index, "logprobs": None,
            "finish_reason": "length" if hole.finish == "max_tokens" else "stop"}
        if call.legacy:
            choice["text"] = hole.text
            if call.logprobs is not None:
                choice["logprobs"] = _legacy_logprobs(
                    token_logprobs(result, hole, call.logprobs))
        elif call.logprobs is not None:
            choice["logprobs"] = {"content": token_logprobs(result, hole, call.logprobs),
                                  "refusal": None}
            choice["message"] = {"role": "assistant", "content": hole.text, "refusal": None}
        elif call.inputs["kind"] == "tool":
            choice["finish_reason"] = "tool_calls" if hole.finish != "max_tokens" else "length"
            choice["message"] = {"role": "assistant", "content": None, "refusal": None,
                                 "tool_calls": [_tool_call(hole.value, request_id, index)]}
        else:
            choice["message"] = {"role": "assistant", "content": hole.text, "refusal": None}
        choices.append(choice)
    prompt_tokens = holes[0].start
    return {
        "id": f"{'cmpl' if call.legacy else 'chatcmpl'}-{request_id}",
        "object": "text_completion" if call.legacy else "chat.completion",
        "created": int(time.time()), "model": call.model, "system_fingerprint": None,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def token_logprobs(result: Result, hole: Any, top: int) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` for the answer `hole`, from the run's trace: each kept token
    of the hole with its log-probability (under the step's mask: what the token was sampled
    from; a forced token's is 0, a select's is in context) and its `top` likeliest
    alternatives. Tokens that re-cover healed prompt text show only the answer's part of it,
    so the tokens spell the answer."""
    trace = result.trace()
    index = next(i for i, h in enumerate(trace["holes"]) if h["name"] == "content")
    events = [e for e in trace["events"] if e["hole"] == index and e["kept"]]
    spelt = "".join(e["text"] for e in events)
    healed = spelt[:len(spelt) - len(hole.text)] if spelt.endswith(hole.text) else ""
    content = []
    for event in events:
        text = event["text"]
        if healed:  # the prompt's text these tokens re-cover: not the answer's
            cut = min(len(healed), len(text))
            text, healed = text[cut:], healed[cut:]
            if not text:
                continue
        content.append({
            "token": text, "logprob": event["logprob"] if event["logprob"] is not None else 0.0,
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": t["text"], "logprob": t["logprob"],
                              "bytes": list(t["text"].encode("utf-8"))}
                             for t in event["top"][:top]]})
    return content


def _legacy_logprobs(content: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat's `logprobs.content` in /v1/completions' shape (columns, and each token's
    character offset in the answer)."""
    offsets, at = [], 0
    for token in content:
        offsets.append(at)
        at += len(token["token"])
    return {"tokens": [t["token"] for t in content],
            "token_logprobs": [t["logprob"] for t in content],
            "top_logprobs": [{a["token"]: a["logprob"] for a in t["top_logprobs"]}
                             for t in content],
            "text_offset": offsets}


def _tool_call(value: dict[str, Any], request_id: str, index: int) -> dict[str, Any]:
    """A `tools=` hole's value (docs/language.md §7.7) as one of OpenAI's `tool_calls`."""
    return {"id": f"call_{request_id}_{index}", "type": "function",
            "function": {"name": value["name"],
                         "arguments": json.dumps(value["arguments"], ensure_ascii=False)}}


def chat_call(body: Any, served: str, legacy: bool = False) -> ChatCall:
    """A chat request's body (with `legacy`, a completion request's), checked (400 with
    OpenAI's `param` where a field is wrong, 404 for another model)."""
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
        if not _neutral(key, value) and not (type(value) in (int, float) and value == 0):
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
    if n > 1 and body.get("stream"):
        raise bad("n: streaming several choices is not supported by qrun serve yet", "n")
    given = {"prompt": prompt_of(body.get("prompt"))} if legacy else {
        "messages": messages_of(body.get("messages"))}
    inputs: dict[str, Any] = {**given, "count": n,
                              "limit": max_tokens_of(body), "stop": stop_of(body.get("stop")),
                              "schema": None, "pattern": None, "grammar": None,
                              "choices": None, "kind": "text", "tools": None, "calls": None}
    field, constraint = constraint_of(body)
    inputs.update(constraint)
    if not legacy:
        tools = tools_of(body)
        if tools is not None:
            inputs.update(tools)
            if field is not None and inputs["kind"] == "tool":
                raise bad(f"{field} and a tool call: give one", field)
            if inputs["kind"] == "tool" and body.get("stream"):
                raise bad("stream: streamed tool calls are not supported by qrun serve yet",
                          "stream")
    logprobs = legacy_logprobs_of(body, n) if legacy else logprobs_of(body, n)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("stream: must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False),
                                                         bool):
        raise bad("stream_options: must be an object with include_usage true or false",
                  "stream_options")
    sampling = sampling_of(body)
    if logprobs is not None:  # the trace keeps each sampled token's alternatives
        sampling = RunOptions(trace=True).over(sampling)
    return ChatCall(model, inputs, sampling, field, stream,
                    bool(options.get("include_usage")), legacy=legacy, logprobs=logprobs)


def legacy_logprobs_of(body: Mapping[str, Any], n: int) -> int | None:
    """/v1/completions' `logprobs`: how many alternatives each token lists (0 to
    TOP_LOGPROBS), or None."""
    top = body.get("logprobs")
    if top is None:
        return None
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= TOP_LOGPROBS:
        raise bad(f"logprobs: must be an integer from 0 to {TOP_LOGPROBS} (the alternatives "
                  "qrun keeps per token)", "logprobs")
    if n > 1 or body.get("stream"):
        raise bad("logprobs: with n > 1 or stream, not supported by qrun serve yet",
                  "logprobs")
    return top


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
    if top is None:
        top = 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= TOP_LOGPROBS:
        raise bad(f"top_logprobs: must be an integer from 0 to {TOP_LOGPROBS} (the "
                  "alternatives qrun keeps per token)", "top_logprobs")
    if n > 1 or body.get("stream"):
        raise bad("logprobs: with n > 1 or stream, not supported by qrun serve yet",
                  "logprobs")
    return top


def tools_of(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """CHAT's inputs for `tools` and `tool_choice`: the tools rendered in the system turn in
    the model's own format (docs/language.md §7.7), and with `required` or a named function
    the answer one call (a `tools=` hole: a tool's name and arguments valid under its
    parameters); `none` answers text. `auto`, which leaves the choice between text and a call
    to the model, is not done yet."""
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
        raise bad("tool_choice: \"auto\" (the default with tools) is not supported by qrun "
                  "serve yet: give \"required\", a named function or \"none\"",
                  "tool_choice")
    raise bad("tool_choice: must be \"none\", \"required\" or a named function",
              "tool_choice")


def prompt_of(prompt: Any) -> str:
    """A completion request's prompt: a string, or a list of one."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt: must be a string (token ids and several prompts are not supported "
                  "by qrun serve yet)", "prompt")
    return prompt


def messages_of(given: Any) -> list[dict[str, str]]:
    if not isinstance(given, list) or not given:
        raise bad("messages: required, a non-empty list", "messages")
    messages = []
    for k, message in enumerate(given):
        where = f"messages[{k}]"
        if not isinstance(message, dict):
            raise bad(f"{where}: must be an object with a role and content", where)
        role = message.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role: must be one of {', '.join(ROLES)} (got "
                      f"{json.dumps(role)[:40]})", f"{where}.role")
        messages.append({"role": ROLES[role],
                         "content": content_of(message.get("content"), f"{where}.content")})
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


def sampling_of(body: Mapping[str, Any]) -> RunOptions:
    given = {key: body[key] for key in ("temperature", "top_p", "top_k", "seed")
             if body.get(key) is not None}
    given.setdefault("temperature", DEFAULT_TEMPERATURE)
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"{key}: must be a number", key)
    if not 0 <= given["temperature"] <= 2:
        raise bad("temperature: must be between 0 and 2", "temperature")
    try:
        return RunOptions(**given)
    except Exception as exc:  # UsageError: a value out of range, said in RunOptions' words
        raise bad(str(exc), next(iter(given))) from None


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


class OpenAIError(ApiError):
    """An ApiError that names the request's field it is about (OpenAI's `param`)."""

    def __init__(self, status: int, code: str, message: str, param: str | None) -> None:
        super().__init__(status, code, message)
        self.param = param


def bad(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, "invalid_request_error", message, param)


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "invalid_request_error",
               408: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def openai_error(error: ApiError) -> dict[str, Any]:
    """`error` in OpenAI's shape; `code` is qrun's stable code (docs/serve.md §4)."""
    return {"error": {"message": error.message,
                      "type": ERROR_TYPES.get(error.status, "server_error"),
                      "param": error.param if isinstance(error, OpenAIError) else None,
                      "code": error.code}}
