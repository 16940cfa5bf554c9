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
ignored (serve/openai_protocol.py reads and checks the bodies; this module runs and answers
them)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from qrun.api import Query
from qrun.errors import RunCancelled
from qrun.options import SAMPLING_OPTIONS, RunOptions
from qrun.serve.openai_errors import OpenAIError, bad, openai_error
from qrun.serve.openai_protocol import (
    CHAT_KNOWN,
    IGNORED,
    ChatCall,
    chat_call,
    inputs_from_messages,
    max_tokens_of,
    neutral,
    option_named,
    sampling_of,
)
from qrun.serve.openai_tools import answer_of
from qrun.serve.protocol import ApiError, check_input_sizes, read_json
from qrun.serve.service import Service, log
from qrun.serve.streams import ended, outcome_of, submit, unless_abandoned

if TYPE_CHECKING:  # the runtime is reached through Query, never imported here
    from qrun.backends.chat_template import ToolCallFormat
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result

ANSWER = """\
{%- if kind == "json" -%}{{ gen content json=schema formats="known" max_tokens=limit }}
{%- elif kind == "regex" -%}{{ gen content regex=pattern max_tokens=limit }}
{%- elif kind == "grammar" -%}{{ gen content grammar=grammar max_tokens=limit }}
{%- elif kind == "choice" -%}{{ select content options=choices }}
{%- elif kind == "tool" -%}{{ gen content tools=calls max_tokens=limit }}
{%- elif kind == "auto" and stop -%}{{ gen content grammar=grammar stop=stop max_tokens=limit }}
{%- elif kind == "auto" and grammar -%}{{ gen content grammar=grammar max_tokens=limit }}
{%- elif kind == "auto" -%}{{ gen content max_tokens=limit }}OWN_AUTO
{%- elif stop -%}{{ gen content stop=stop max_tokens=limit }}
{%- else -%}{{ gen content max_tokens=limit }}
{%- endif -%}"""

_CHAT = """\
{%- if tools and messages[0].role != "system" -%}{% system tools=tools %}{% endsystem %}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == "system" and tools and loop.first -%}
{% system tools=tools %}{{ m.content }}{% endsystem %}
{%- elif m.role == "system" -%}{% system %}{{ m.content }}{% endsystem %}
{%- elif m.role == "user" -%}{% user %}{{ m.content }}{% enduser %}
{%- else -%}{% assistant %}{{ m.content }}OWN_CALLS{% endassistant %}
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

def chat_template(call_format: ToolCallFormat | None) -> str:
    """CHAT for a model that writes tool calls in `call_format`, its own (prefix and suffix
    around the call's JSON, backends/chat_template.py), or None. With a format of its own,
    whose prefix may be control tokens that request text must never spell, the prefix and
    suffix are the template's own text: an earlier call in the conversation is written
    between them, and under tool_choice "auto" the answer is text that ends where the model
    begins the prefix (a hole ends where the model writes the text that follows it,
    docs/language.md §14.5), then, only if it did, the call's JSON under the tools' call
    schema in the model's keys (`call_schema`) and the suffix. Without one, an earlier call
    is the JSON object in the message's text, and "auto" a grammar (serve/openai_tools.py)."""
    if call_format is None:
        return _CHAT.replace("OWN_AUTO", "").replace("OWN_CALLS", "")
    prefix, suffix = raw(call_format.prefix), raw(call_format.suffix)
    answer = (prefix + '{% if holes.content.finish == "boundary" %}'
              '{{ gen call json=call_schema formats="known" max_tokens=limit }}'
              + suffix + "{% endif %}")
    calls = "{% for c in m.calls or [] %}" + prefix + "{{ c }}" + suffix + "{% endfor %}"
    return _CHAT.replace("OWN_AUTO", answer).replace("OWN_CALLS", calls)


def raw(text: str) -> str:
    """`text` as template text read as written (a model's call prefix: `<tool_call>` and a
    newline), in a raw block."""
    if "{% endraw %}" in text or "{%endraw%}" in text:
        raise ValueError(f"a tool-call format holding a raw block's end: {text!r}")
    return "{% raw %}" + text + "{% endraw %}"


CHAT = chat_template(None)
"""CHAT for a model without a tool-call format of its own (SmolLM2's, the tiny test model's)."""


COMPLETE = """\
{{ prompt }}
{%- if count == 1 -%}""" + ANSWER.replace("OWN_AUTO", "") + """
{%- else -%}{% fork i in range(count) %}""" + ANSWER.replace("OWN_AUTO", "") + """{% endfork %}
{%- endif -%}"""
"""The template of `POST /v1/completions` (OpenAI's legacy text completions): the prompt as
text, never control tokens, then the answer as CHAT's."""


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
    call_format = service.backend.tool_call_format()
    own_keys = call_format.keys if call_format is not None else None
    # In a thread: checking tools under tool_choice "auto" compiles their grammar.
    call = await asyncio.to_thread(chat_call, body, model_id(service), legacy, own_keys)
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
    allowed = {"model", "messages", "inputs", *SAMPLING_OPTIONS, "seed", "max_tokens",
               "max_completion_tokens", *IGNORED}
    asked = sorted(key for key in set(body) - allowed
                   if key not in CHAT_KNOWN or not neutral(key, body[key]))
    if asked:
        raise bad(f"{asked[0]}: not taken by a template (its holes have their own "
                  "constraints and options)", asked[0])
    inputs = body.get("inputs")
    if inputs is None:
        inputs = inputs_from_messages(body.get("messages"))
    if not isinstance(inputs, dict):
        raise bad("inputs: must be a JSON object", "inputs")
    check_input_sizes(inputs, service.limits)
    run_options = sampling_of(body, temperature=None)
    if body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None:
        run_options = RunOptions(max_tokens=max_tokens_of(body)).over(run_options)
    run = query.request(inputs, options=run_options)  # InputError: 422, as a template's run
    log.info("[%s] chat completion by template %s", request_id, name)
    result = await outcome_of(service, request, submit(service, run), None, request_id)
    answer = result.output if result.output is not None else result.vars
    stats = result.stats
    completion_tokens = stats.generated_tokens + stats.forced_tokens
    return JSONResponse({
        **_header(request_id, body["model"], "chat.completion"),
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "refusal": None,
                                 "content": json.dumps(answer, ensure_ascii=False)}}],
        "usage": _usage(stats.prompt_tokens, completion_tokens)})


def _as_client_error(error: ApiError, call: ChatCall) -> ApiError:
    """CHAT itself compiles and evaluates: an error of its text at run time is the request's
    constraint or tools (a schema, regex, grammar or tool list qrun refuses), answered as the
    client's mistake."""
    if error.code in ("template_error", "evaluation_error"):
        field = "tools" if call.inputs.get("tools") is not None else call.constraint_field
        return OpenAIError(400, "invalid_constraint", error.message, field)
    if error.code == "context_too_long":  # OpenAI's code for it, and its param
        given = "prompt" if call.legacy else "messages"
        return OpenAIError(400, "context_length_exceeded", f"{error.message} (the {given} "
                           "and max_tokens must fit the model's context)", given)
    if error.code == "value_cut_off":  # the request's max_tokens: a 400 the SDK does not retry
        return OpenAIError(400, "value_cut_off", f"{error.message}: the answer did not complete "
                           "its constraint within max_tokens; give more", "max_tokens")
    if error.code == "input_error":  # a run option only the model can check (logit_bias ids)
        return OpenAIError(400, "invalid_request_error", error.message,
                           option_named(error.message))
    return error


def _stream(service: Service, run: RunRequest, call: ChatCall, request_id: str) -> Response:
    """Server-sent events in OpenAI's chunk format: the role, the answer's text as the model
    writes it (stop strings held back until they cannot be one), the finish reason, the usage
    (with stream_options.include_usage), `[DONE]`. With n > 1 each choice's text comes whole
    when the run ends (branches are not told as they are written), and the tokens'
    log-probabilities come whole with the finish reason. A tool call is sent whole, in one
    `tool_calls` delta once it is written (under "auto", an answer that begins with `{` is a
    call: serve/openai_tools.py). A failure once the stream has begun is an `error` event
    (the SDK raises it)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def push(kind: str, data: Any) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (kind, data))

    ticket = submit(service, run.streaming(None, None, push))  # told each hole's text by name
    ticket.future.add_done_callback(lambda future: push("end", future))
    base = _header(request_id, call.model,
                   "text_completion" if call.legacy else "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0,
              logprobs: Any = None) -> str:
        if call.legacy:
            choice = {"index": index, "text": delta.get("content") or "", "logprobs": logprobs,
                      "finish_reason": finish}
        else:
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish}
        return _event({**base, "choices": [choice]})

    kind = call.inputs["kind"]

    async def produce() -> AsyncIterator[str]:
        # A call's text is held until it is whole: "tool" is a call; under "auto" the answer's
        # first piece says which (a call begins with "{", serve/openai_tools.py), once: text
        # may hold a "{" later on; a model with a call format of its own writes the call as a
        # hole of its own ("call", chat_template).
        held: list[str] = []
        holding, decided = kind == "tool", kind != "auto" or call.own_keys is not None
        try:
            if not call.legacy:  # a call's answer has no content (null), as OpenAI's
                yield chunk({"role": "assistant", "content": None if kind == "tool" else ""})
            elif call.echo and call.n == 1:  # with n > 1 each choice comes whole, echoed
                yield chunk({"content": call.inputs["prompt"]})
            while True:
                try:
                    event, data = await unless_abandoned(
                        service, asyncio.ensure_future(events.get()), None)
                except RunCancelled as exc:
                    yield _event(openai_error(service.failure(exc, request_id)))
                    return
                if event == "call":  # a call in the model's own format: whole, at the end
                    held.append(data)
                    continue
                if event == "content":
                    if not decided and data:
                        holding, decided = data.startswith("{"), True
                    if holding:
                        held.append(data)
                    else:
                        yield chunk({"content": data})
                    continue
                error = ended(service, data, request_id)
                if error is not None:
                    yield _event(openai_error(_as_client_error(error, call)))
                    return
                answer = completion(data.result(), call, request_id)
                for index, choice in enumerate(answer["choices"]):
                    if call.n > 1:  # branches are not told as they are written: whole now
                        text = choice["text"] if call.legacy else choice["message"]["content"]
                        if index > 0 and not call.legacy:
                            yield chunk({"role": "assistant", "content": ""}, index=index)
                        if text:
                            yield chunk({"content": text}, index=index)
                    calls = choice.get("message", {}).get("tool_calls")
                    if calls:
                        yield chunk({"tool_calls": [{"index": 0, **calls[0]}]}, index=index)
                    elif held:  # not a call after all: the text, as it would have come
                        yield chunk({"content": "".join(held)}, index=index)
                    # The tokens' log-probabilities come from the run's trace, whole at the
                    # end, with the finish reason (the SDK joins them to the text's).
                    yield chunk({}, choice["finish_reason"], index, choice["logprobs"])
                if call.include_usage:
                    yield _event({**base, "choices": [], "usage": answer["usage"]})
                yield "data: [DONE]\n\n"
                return
        finally:
            ticket.cancel()  # a client gone away: the run stops at its next forward

    return StreamingResponse(produce(), media_type="text/event-stream",
                             headers={"X-Request-ID": request_id, "Cache-Control": "no-cache"})


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def completion(result: Result, call: ChatCall, request_id: str) -> dict[str, Any]:
    """The chat.completion object of a finished run. Usage counts tokens as the model read
    them: the prompt is every context position before the answer's first decision (the chat
    format's tokens included; fed once for all `n` choices), the completion every choice's
    tokens."""
    holes = (result.hole_lists["content"] if call.inputs["count"] > 1
             else [result.holes["content"]])
    # The first tokens may only re-produce prompt text that healing took back. Every branch
    # run counts (best_of's too, as OpenAI's).
    completion_tokens = sum(len(h.token_ids) - getattr(h, "prefix_tokens", 0) for h in holes)
    prompt_tokens = holes[0].start
    if len(holes) > call.n:  # best_of: the n likeliest, by the sum of their log-probabilities
        holes = sorted(holes, key=_likelihood, reverse=True)[:call.n]
    choices = []
    for index, hole in enumerate(holes):
        choice: dict[str, Any] = {
            "index": index, "logprobs": None,
            "finish_reason": "length" if hole.finish == "max_tokens" else "stop"}
        if call.logprobs is not None:
            tokens = token_logprobs(result, hole, call.logprobs)
            choice["logprobs"] = (_legacy_logprobs(tokens) if call.legacy
                                  else {"content": tokens, "refusal": None})
        if call.legacy:
            choice["text"] = (call.inputs["prompt"] if call.echo else "") + hole.text
        elif call.inputs["kind"] in ("tool", "auto"):
            content, value = ((None, hole.value) if call.inputs["kind"] == "tool"
                              else _own_answer(result, call.own_keys) if call.own_keys
                              else answer_of(hole.text))
            choice["message"] = {"role": "assistant", "content": content, "refusal": None}
            if value is not None:
                choice["message"]["tool_calls"] = [_tool_call(value, request_id, index)]
                if hole.finish != "max_tokens":
                    choice["finish_reason"] = "tool_calls"
        else:
            choice["message"] = {"role": "assistant", "content": hole.text, "refusal": None}
        choices.append(choice)
    return {**_header(request_id, call.model,
                      "text_completion" if call.legacy else "chat.completion"),
            "choices": choices, "usage": _usage(prompt_tokens, completion_tokens)}


def _own_answer(result: Result, keys: Any) -> tuple[str | None, dict[str, Any] | None]:
    """An answer under "auto" on a model with a call format of its own (chat_template): the
    text, then the call where the model began one (its object in the model's keys)."""
    written = result.holes["content"].text
    text = written if written.strip() else None  # the blank the model wrote before the call
    made = result.holes.get("call")
    if made is None:
        return text, None
    return text, {"name": made.value[keys.name], "arguments": made.value[keys.arguments]}


def _likelihood(hole: Any) -> float:
    """The log-probability of a hole's value: its sampled tokens' (a forced token has none: it
    had no alternative)."""
    return float(sum(p for p in hole.logprobs if p is not None and p == p))


def _header(request_id: str, model: str, kind: str) -> dict[str, Any]:
    """The fields every answer and chunk opens with; `kind` is OpenAI's `object`."""
    prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
    return {"id": f"{prefix}-{request_id}", "object": kind, "created": int(time.time()),
            "model": model, "system_fingerprint": None}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


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
