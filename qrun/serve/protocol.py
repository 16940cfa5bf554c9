"""The wire protocol of `qrun serve` (docs/serve.md §2, §4): the limits and errors of a request,
and its body, options and fields read and checked; nothing here runs anything (vLLM's
entrypoints keep the same split: protocol, serving, router)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request

from qrun.errors import (
    BackendError,
    ContextTooLong,
    EvaluationError,
    GenerationError,
    HostFunctionError,
    InputError,
    PositionedError,
    QrunError,
    RunCancelled,
    TemplateError,
    UsageError,
    ValueCutOff,
    render_at,
)
from qrun.jsonio import (
    DEFAULT_FIELDS,
    FIELDS,
    BadInput,
    parse_value,
)
from qrun.options import SAMPLING_OPTIONS, RunOptions

if TYPE_CHECKING:
    from qrun.api import (
        Query,  # the runtime and backends are reached through Query, never imported here
    )
    from qrun.runtime.request import RunRequest


MAX_BODY_BYTES = 1 << 20
"""The largest request body read (413 beyond it)."""


BODY_TIMEOUT_S = 60
"""How long a request's body may take to arrive, whole: a megabyte in a minute is a slow
link's pace, and a body dripped in to hold a connection is cut."""


RETRY_AFTER_S = 1
"""What a 429 or a draining 503 answers in Retry-After: runs of small templates end within
about a second (and a server draining is usually being replaced)."""


MAX_INPUT_CHARS = 100_000
"""The longest string an input may hold, at any depth (422 `input_too_large` beyond): a few
times the context of the models served here; the body's limit alone would let one string
fill it."""


MAX_INPUT_DEPTH = 32
"""How deep an input's lists and objects may nest (the body's JSON may nest 100 levels,
qrun/jsonio.py, for the body's own wrapping and the other inputs)."""


REQUEST_OPTIONS = (*SAMPLING_OPTIONS, "seed", "max_tokens", "speculate", "sampler", "particles",
                   "ess_threshold")
"""The run options a request may set (RunOptions; limits and trace stay the server's)."""


BODY_KEYS = ("inputs", "options", "stream", "fields", "fill")


REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class ApiError(Exception):
    """A request answered with an error: HTTP `status`, a stable `code`, a message, and for
    errors about a place in a template its position."""

    def __init__(self, status: int, code: str, message: str,
                 position: dict[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.position = position
        self.headers = dict(headers or {})

    def body(self, request_id: str) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.position is not None:
            error["position"] = self.position
        return {"error": error, "request_id": request_id}


def api_error(exc: BaseException, names: Mapping[str, str] | None = None) -> ApiError:
    """The answer to a run's failure (docs/serve.md §4). `names`: the name each template file
    is served under, by its path, so a position names no path of the server's."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError | UsageError) and not isinstance(exc, TemplateError):
        return ApiError(422, "input_error", message_of(exc), position_of(exc, names))
    if isinstance(exc, ContextTooLong):  # the request's size: a 4xx, as input_too_large
        return ApiError(422, "context_too_long", message_of(exc), position_of(exc, names))
    if isinstance(exc, ValueCutOff):  # the template's max_tokens (or a request's): its author's
        return ApiError(500, "value_cut_off", message_of(exc), position_of(exc, names))
    if isinstance(exc, GenerationError):
        return ApiError(500, "generation_error", message_of(exc), position_of(exc, names))
    if isinstance(exc, HostFunctionError):  # its text is for the server's log only
        return ApiError(500, "host_function_error", exc.public_message,
                        position_of(exc, names, exc.public_message))
    if isinstance(exc, EvaluationError):
        return ApiError(500, "evaluation_error", message_of(exc), position_of(exc, names))
    if isinstance(exc, TemplateError):
        return ApiError(500, "template_error", message_of(exc), position_of(exc, names))
    if isinstance(exc, BackendError):
        return ApiError(502, "backend_error", message_of(exc), position_of(exc, names))
    if isinstance(exc, RunCancelled):
        return ApiError(504, "timeout", "the run was cancelled: its deadline passed")
    if isinstance(exc, QrunError):
        return ApiError(500, "run_error", str(exc))
    return ApiError(500, "internal_error", "internal error (the server's log has it)")


def message_of(exc: QrunError) -> str:
    return exc.message if isinstance(exc, PositionedError) else str(exc)


def position_of(exc: QrunError, names: Mapping[str, str] | None = None,
                message: str | None = None) -> dict[str, Any] | None:
    """Where `exc` is, as a client sees it: the template under the name it is served by (a
    file included by one: its file name alone), rendered with `message` in place of the
    error's own where that is not for clients."""
    if not isinstance(exc, PositionedError):
        return None
    name = exc.source.name
    shown = (names or {}).get(name) or (PurePath(name).name if PurePath(name).is_absolute()
                                        else name)
    rendered = render_at(exc.kind, exc.message if message is None else message, exc.span,
                         replace(exc.source, name=shown), exc.notes)
    return {"template": shown, "line": exc.span.line, "column": exc.span.column,
            "rendered": rendered, "notes": list(exc.notes)}


@dataclass(frozen=True)
class ServeOptions:
    """A server's admission and request limits: `app()`'s keywords and the flags of `qrun
    serve` (qrun/cli/command.py), checked here once for both.

    Raises (on construction):
        UsageError: a limit that is not an integer, or below its least value.
    """

    max_running: int = 8
    max_queue: int = 64
    max_body_bytes: int = MAX_BODY_BYTES
    max_input_chars: int = MAX_INPUT_CHARS
    max_input_depth: int = MAX_INPUT_DEPTH
    body_timeout_s: int = BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        problem = _limit_problem(self.keywords(), str)
        if problem is not None:
            raise UsageError(problem)

    @classmethod
    def checked(cls, values: Mapping[str, int], spell: Callable[[str], str]) -> ServeOptions:
        """`ServeOptions(**values)`, a problem reported naming each limit as `spell` writes
        it (the command line: `--max-running`), as ModelOptions.checked (qrun/options.py)."""
        problem = _limit_problem(values, spell)
        if problem is not None:
            raise UsageError(problem)
        return cls(**values)

    def keywords(self) -> dict[str, int]:
        """The limits as app()'s keyword arguments."""
        return {item.name: getattr(self, item.name) for item in fields(self)}


def _limit_problem(values: Mapping[str, Any], spell: Callable[[str], str]) -> str | None:
    """What is wrong with the first bad limit in `values`, named as `spell` writes it."""
    for name, value in values.items():
        least = _LEAST[name]
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{spell(name)} must be an integer ≥ {least}, got {value!r}"
        if value < least:
            return f"{spell(name)} must be ≥ {least}, got {value}"
    return None


_LEAST = {"max_running": 1, "max_queue": 0, "max_body_bytes": 1, "max_input_chars": 1,
          "max_input_depth": 1, "body_timeout_s": 1}


@dataclass
class RunBody:
    """A checked POST /v1/templates/{name}/run body: the run it asks for (Query.request), and
    how to answer it."""

    name: str
    request: RunRequest
    timeout: float | None
    stream: bool
    fields: tuple[str, ...]


def request_id_of(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]


JSON_TYPES = frozenset({"application/json"})
"""The media types a run's body may declare."""
JSON_LINES_TYPES = frozenset({"application/x-ndjson", "application/jsonl",
                              "application/x-jsonlines", "application/json"})
"""The media types a batch's body may declare."""


def require_media_type(request: Request, accepted: frozenset[str]) -> None:
    """415 `unsupported_media_type` unless the body declares one of `accepted`. Why: a web
    page may POST `text/plain`, a form or multipart to any address without asking first (a
    CORS "simple request"), so a server on 127.0.0.1 with no key would run templates for any
    site its user visits; a JSON type makes the browser ask first, and nothing here answers
    that preflight (issue #38)."""
    declared = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if declared not in accepted:
        shown = f"Content-Type {declared[:60]!r}" if declared else "no Content-Type"
        raise ApiError(415, "unsupported_media_type",
                       f"the body must be sent as {' or '.join(sorted(accepted))}, "
                       f"not {shown}")


async def read_json(request: Request, limits: ServeOptions) -> Any:
    """The body as strict JSON (qrun/jsonio.py), read as read_body reads; it must be sent as
    application/json."""
    require_media_type(request, JSON_TYPES)
    data = await read_body(request, limits)
    try:
        return parse_value(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(400, "bad_request", f"the body is not UTF-8 (byte {exc.start + 1})") \
            from None
    except BadInput as exc:
        raise ApiError(400, "bad_request", f"the body: {exc}") from None


async def read_body(request: Request, limits: ServeOptions) -> bytes:
    """The body's bytes, at most `limits.max_body_bytes` (413 beyond, with or without a
    Content-Length), all arrived within `limits.body_timeout_s` (408 `body_timeout` after:
    issue #38, a body sent a byte every 5 s was never cut)."""
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            return await _read_body(request, limits.max_body_bytes)
    except ClientDisconnect:  # gone before its body ended (or the server shut it): no bug
        raise ApiError(499, "client_closed", "the connection closed before the body ended") \
            from None
    except TimeoutError:
        raise ApiError(408, "body_timeout", f"the body took longer than "
                       f"{limits.body_timeout_s} s to arrive (--body-timeout)",
                       headers={"Connection": "close"}) from None


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise ApiError(413, "body_too_large", f"the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def run_body(query: Query, name: str, limits: ServeOptions, body: Any,
             request: Request) -> RunBody:
    """The body of a run request of template `name` (`query`), checked: unknown keys, options
    and fields are 400; inputs that do not fit the template 422 (before the run is
    admitted)."""
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    unknown = sorted(set(body) - set(BODY_KEYS))
    if unknown:
        raise ApiError(400, "bad_request", f"unknown key(s) {', '.join(map(repr, unknown))}: "
                       f"the body may have {', '.join(BODY_KEYS)}")
    inputs = body.get("inputs", {})
    given = body.get("options", {})
    if not isinstance(inputs, dict) or not isinstance(given, dict):
        raise ApiError(400, "bad_request", '"inputs" and "options" must be JSON objects')
    options, timeout = run_options(given)
    fields = fields_of(body.get("fields", list(DEFAULT_FIELDS)))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "bad_request", '"stream" must be true or false')
    stream = stream or "text/event-stream" in request.headers.get("accept", "")
    fill = body.get("fill", {})
    if not isinstance(fill, dict):
        raise ApiError(400, "bad_request", '"fill" must be a JSON object')
    # Sizes first, on the request's own values: the template's checks (its patterns) never
    # scan an oversized string, and a long default of the template is not the client's.
    check_input_sizes(inputs, limits)
    check_input_sizes(fill, limits, "fill")
    # InputError, UsageError (a name that is no hole): 422, before the run is admitted
    run = query.request(inputs, options=options, fill=fill)
    return RunBody(name, run, timeout, stream, fields)


def check_input_sizes(inputs: Mapping[str, Any], limits: ServeOptions,
                      what: str = "input") -> None:
    """Each input's strings at most `limits.max_input_chars` long and its lists and objects
    nested at most `limits.max_input_depth` deep (inputs are JSON data, as a body reads;
    `what`: "fill" for a request's known values, which the same limits bound).

    Raises:
        ApiError: 422 `input_too_large`, naming the input and the place in it.
    """
    # (place, value, depth): iterative, as deep inputs are what this refuses.
    todo: list[tuple[str, Any, int]] = [(name, value, 0) for name, value in inputs.items()]
    while todo:
        place, value, depth = todo.pop()
        if isinstance(value, str) and len(value) > limits.max_input_chars:
            raise ApiError(422, "input_too_large", f"{what} {place} is a string of {len(value)} "
                           f"characters; this server takes at most {limits.max_input_chars} "
                           "(--max-input-chars)")
        items: Iterable[tuple[str, Any]]
        if isinstance(value, Mapping):
            long_key = next((k for k in value if isinstance(k, str)
                             and len(k) > limits.max_input_chars), None)
            if long_key is not None:  # a key is a string too (issue #38: 100,001 passed)
                raise ApiError(422, "input_too_large", f"{what} {place} has a key of "
                               f"{len(long_key)} characters; this server takes at most "
                               f"{limits.max_input_chars} (--max-input-chars)")
            items = ((f"{place}[{_shown_key(key)}]", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            items = ((f"{place}[{index}]", item) for index, item in enumerate(value))
        else:
            continue
        if depth >= limits.max_input_depth:
            raise ApiError(422, "input_too_large", f"{what} {place} nests lists and objects "
                           f"deeper than {limits.max_input_depth} levels (--max-input-depth)")
        todo.extend((where, item, depth + 1) for where, item in items)


def _shown_key(key: Any) -> str:
    """A key as an error's place shows it: JSON, cut short (a message never echoes a long
    key back whole)."""
    shown = json.dumps(key)
    return shown if len(shown) <= 42 else shown[:40] + '..."'


def run_options(given: dict[str, Any]) -> tuple[RunOptions, float | None]:
    """A request's run options and its timeout, checked (400)."""
    given = dict(given)
    timeout = given.pop("timeout", None)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not timeout > 0):
        raise ApiError(400, "bad_request", f"options.timeout must be a positive number of "
                       f"seconds, got {json.dumps(timeout)}")
    unknown = sorted(set(given) - set(REQUEST_OPTIONS))
    if unknown:
        raise ApiError(400, "bad_request", f"unknown option(s) {', '.join(map(repr, unknown))}: "
                       f"choose among {', '.join(REQUEST_OPTIONS)}, timeout")
    try:
        options = RunOptions(**given)
    except UsageError as exc:
        raise ApiError(400, "bad_request", f"options: {exc}") from None
    return options, float(timeout) if timeout is not None else None


def fields_of(fields: Any) -> tuple[str, ...]:
    if not isinstance(fields, list) or not fields or any(f not in FIELDS for f in fields):
        raise ApiError(400, "bad_request", f'"fields" must be a list among {", ".join(FIELDS)}')
    return tuple(dict.fromkeys(fields))
