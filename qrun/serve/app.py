"""The ASGI app of `qrun serve` (docs/serve.md): templates as HTTP endpoints on one model, the
runs of every request admitted to the model's runner (qrun/runtime/runner.py, through
`Query.request` and `Query.runner`, as a Python user runs them) and batched together. Errors
are JSON with a stable code (docs/serve.md §4), never a traceback; every response carries the
request's id, and so do the log lines about it."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from qrun.api import HostFunctions, Query
from qrun.errors import (
    BackendError,
    EvaluationError,
    GenerationError,
    InputError,
    PositionedError,
    QrunError,
    QueueFull,
    RunCancelled,
    TemplateError,
    UsageError,
)
from qrun.jsonio import (
    DEFAULT_FIELDS,
    FIELDS,
    BadInput,
    Rows,
    dumps_line,
    parse_line,
    parse_value,
    split_lines,
)
from qrun.options import ModelOptions, RunOptions
from qrun.serve.catalog import describe, served
from qrun.serve.openapi import openapi

if TYPE_CHECKING:  # the runtime and backends are reached through Query, never imported here
    from qrun.backends.base import Backend
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result
    from qrun.runtime.runner import Admission, Ticket

log = logging.getLogger("qrun.serve")

MAX_BODY_BYTES = 1 << 20
"""The largest request body read (413 beyond it)."""
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
REQUEST_OPTIONS = ("temperature", "top_p", "top_k", "seed", "max_tokens", "speculate")
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


def api_error(exc: BaseException) -> ApiError:
    """The answer to a run's failure (docs/serve.md §4)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError | UsageError) and not isinstance(exc, TemplateError):
        return ApiError(422, "input_error", _message(exc), _position(exc))
    if isinstance(exc, GenerationError):
        return ApiError(500, "generation_error", _message(exc), _position(exc))
    if isinstance(exc, EvaluationError):
        return ApiError(500, "evaluation_error", _message(exc), _position(exc))
    if isinstance(exc, TemplateError):
        return ApiError(500, "template_error", _message(exc), _position(exc))
    if isinstance(exc, BackendError):
        return ApiError(502, "backend_error", _message(exc), _position(exc))
    if isinstance(exc, RunCancelled):
        return ApiError(504, "timeout", "the run was cancelled: its deadline passed")
    if isinstance(exc, QrunError):
        return ApiError(500, "run_error", str(exc))
    return ApiError(500, "internal_error", "internal error (the server's log has it)")


def _message(exc: QrunError) -> str:
    return exc.message if isinstance(exc, PositionedError) else str(exc)


def _position(exc: QrunError) -> dict[str, Any] | None:
    if not isinstance(exc, PositionedError):
        return None
    return {"template": exc.source.name, "line": exc.span.line, "column": exc.span.column,
            "rendered": exc.render(), "notes": list(exc.notes)}


@dataclass(frozen=True)
class ServerLimits:
    """A server's admission and request limits (the flags of `qrun serve`)."""

    max_running: int = 8
    max_queue: int = 64
    max_body_bytes: int = MAX_BODY_BYTES
    max_input_chars: int = MAX_INPUT_CHARS
    max_input_depth: int = MAX_INPUT_DEPTH


class Metrics:
    """The app's Prometheus metrics, in a registry of its own (two apps in one process do not
    share counters)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("qrun_requests", "Requests answered, by HTTP status",
                                ["status"], registry=self.registry)
        self.queue_depth = Gauge("qrun_queue_depth", "Runs waiting for a slot",
                                 registry=self.registry)
        self.running = Gauge("qrun_running_runs", "Runs in progress", registry=self.registry)
        self.tokens = Counter("qrun_generated_tokens", "Tokens sampled for holes (a rate of "
                              "it is the tokens/s)", registry=self.registry)
        self.mask_s = Counter("qrun_mask_seconds", "Time computing token masks",
                              registry=self.registry)
        self.model_s = Counter("qrun_model_seconds", "Time inside model forwards, summed over "
                               "runs (a batched forward counts for each of its runs)",
                               registry=self.registry)
        self.cancelled = Counter("qrun_runs_cancelled", "Runs stopped at a forward because "
                                 "their request went away, timed out or was abandoned by a "
                                 "drain", registry=self.registry)
        self.batch_rows = Histogram("qrun_forward_batch_size", "Rows of each batched forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                                    registry=self.registry)

    def count(self, result: Result) -> None:
        """A finished run's work."""
        self.tokens.inc(result.stats.generated_tokens)
        self.mask_s.inc(result.stats.mask_s)
        self.model_s.inc(result.stats.model_s)

    def ended(self, outcome: Future[Result]) -> None:
        """A run's end (told by its future, in the run's thread before its request hears of
        it): its work, or that it was stopped at a forward. A run taken out of the queue
        never started, and counts for nothing."""
        if outcome.cancelled():
            return
        error = outcome.exception()
        if error is None:
            self.count(outcome.result())
        elif isinstance(error, RunCancelled):
            self.cancelled.inc()

    def watch(self, runs: Admission) -> None:
        self.queue_depth.set_function(lambda: runs.queued)
        self.running.set_function(lambda: runs.active)


class Service:
    """What the app's handlers share: the templates, the model, the run scheduler, the
    metrics and the limits."""

    def __init__(self, templates: Mapping[str, Query], backend: Backend, limits: ServerLimits,
                 api_key: str | None) -> None:
        self.templates = dict(templates)
        self.backend = backend
        self.limits = limits
        self.api_key = api_key
        self.metrics = Metrics()
        # The model's one runner (compiled constraints, batched forwards), shared with any
        # other user of the backend; this server's requests are an admission of their own.
        self.runner = next(iter(self.templates.values())).runner(backend)
        self.runs = self.runner.admission(limits.max_running, limits.max_queue)
        self.largest_batch = 0  # the most rows of a batched forward while it serves
        self.unwatch = self.runner.watch_batches(self._batched)
        self.metrics.watch(self.runs)
        self.descriptions = [describe(name, query) for name, query in self.templates.items()]
        # Shutdown (docs/serve.md §5, qrun/serve/server.py). Read and written on the event
        # loop's thread only.
        self.draining = False  # new requests are answered 503 `draining`
        self.abandoned = False  # the drain timed out: the runs left were cancelled
        self.in_flight = 0  # requests accepted (not answered 503) and not yet answered
        # Set by abandon: a request waiting on a run answers now, even where the run cannot end
        # at once (a host function it is in holds it up to its call_timeout_s).
        self.abandoning = asyncio.Event()

    def _batched(self, rows: int) -> None:
        self.metrics.batch_rows.observe(rows)
        self.largest_batch = max(self.largest_batch, rows)

    def drain(self) -> None:
        """Stop accepting requests: from now on each new one is answered 503 `draining`
        (/metrics excepted), and those accepted go on."""
        self.draining = True

    def abandon(self) -> None:
        """The drain's time is up: cancel every run left (queued, running, and a batch's
        lines not yet started); their requests are answered 503 `draining`."""
        self.draining = self.abandoned = True
        self.runs.cancel_all()
        self.abandoning.set()

    @property
    def drained(self) -> bool:
        """Every accepted request has been answered."""
        return self.in_flight == 0 and self.runs.idle

    def failure(self, exc: BaseException) -> ApiError:
        """The answer to a run's failure: a run cancelled by `abandon` is 503 `draining`,
        not the 504 of a request's own deadline."""
        if self.abandoned and isinstance(exc, RunCancelled | asyncio.CancelledError):
            return ApiError(503, "draining", "the server shut down before this run ended "
                            "(its --drain-timeout passed)",
                            headers={"Retry-After": str(RETRY_AFTER_S)})
        return api_error(exc)


class DrainGate:
    """ASGI middleware: while the service drains, a new request is answered 503 `draining`
    with Retry-After and `Connection: close` (a client's next request opens a connection,
    which the server refuses once it has stopped listening); /healthz says so too, so a load
    balancer stops sending. It counts the requests it lets through until their responses are
    sent (streams included): the drain waits for them."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.service.draining and scope["path"] != "/metrics":
            request = Request(scope)
            error = ApiError(503, "draining", "the server is shutting down: it takes no new "
                             "requests", headers={"Retry-After": str(RETRY_AFTER_S),
                                                  "Connection": "close"})
            extra = {"status": "draining"} if scope["path"] == "/healthz" else {}
            response = _error_response(error, _request_id(request), self.service, **extra)
            await response(scope, receive, send)
            return
        self.service.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.service.in_flight -= 1


@dataclass
class RunBody:
    """A checked POST /v1/templates/{name}/run body: the run it asks for (Query.request), and
    how to answer it."""

    name: str
    request: RunRequest
    timeout: float | None
    stream: bool
    fields: tuple[str, ...]


def app(
    templates: Mapping[str, Query] | Iterable[str],
    *,
    model: Backend | ModelOptions | str | None = None,
    functions: HostFunctions | None = None,
    max_running: int = 8,
    max_queue: int = 64,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_input_chars: int = MAX_INPUT_CHARS,
    max_input_depth: int = MAX_INPUT_DEPTH,
    api_key: str | None = None,
) -> Starlette:
    """The ASGI app serving `templates` (name -> Query, or `.tmpl` files and folders, compiled
    with `functions`) on `model` (a loaded backend, or what `load_model` takes: loaded now).
    `api_key`: requests must carry `Authorization: Bearer KEY`. `max_input_chars`,
    `max_input_depth`: the largest input a request may give (check_input_sizes).

    Raises:
        UsageError: a bad limit, a missing template file or two templates with one name.
        TemplateErrors: a template does not compile.
        ModelLoadError: the model cannot be loaded.
    """
    for flag, value, least in (("max_running", max_running, 1), ("max_queue", max_queue, 0),
                               ("max_body_bytes", max_body_bytes, 1),
                               ("max_input_chars", max_input_chars, 1),
                               ("max_input_depth", max_input_depth, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"{flag} must be an integer ≥ {least}, got {value!r}")
    queries = served(templates, functions)
    if not queries:
        raise UsageError("no template to serve")
    backend = _backend(model, queries)
    limits = ServerLimits(max_running, max_queue, max_body_bytes, max_input_chars,
                          max_input_depth)
    service = Service(queries, backend, limits,
                      api_key or None)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.to_thread(service.runs.close)
            service.unwatch()

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "bad_request")
        return _error_response(ApiError(status, code, f"{request.method} {request.url.path}: "
                                        f"{'no such endpoint' if status == 404 else code}"),
                               _request_id(request), service)

    routes = [
        Route("/healthz", _handler(service, _healthz, public=True), methods=["GET"]),
        Route("/openapi.json", _handler(service, _openapi), methods=["GET"]),
        Route("/metrics", _handler(service, _metrics), methods=["GET"]),
        Route("/v1/templates", _handler(service, _list), methods=["GET"]),
        Route("/v1/templates/{name}", _handler(service, _one), methods=["GET"]),
        Route("/v1/templates/{name}/run", _handler(service, _run), methods=["POST"]),
        Route("/v1/templates/{name}/batch", _handler(service, _batch), methods=["POST"]),
    ]
    starlette = Starlette(routes=routes, lifespan=lifespan,
                          middleware=[Middleware(DrainGate, service=service)],
                          exception_handlers={HTTPException: not_found})
    starlette.state.qrun = service
    return starlette


def _backend(model: Backend | ModelOptions | str | None,
             queries: Mapping[str, Query]) -> Backend:
    if model is None or isinstance(model, str):
        options = ModelOptions(model=model)
    elif isinstance(model, ModelOptions):
        options = model
    else:
        return model
    # One model serves every template: the first template's front matter fills in what the
    # caller left open (docs/serve.md §3).
    return next(iter(queries.values())).load(options=options)


Handler = Callable[[Service, Request, str], Awaitable[Response]]


def _handler(service: Service, handler: Handler,
             public: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """`handler` with the request's id, its key checked (unless `public`), its failures
    answered as JSON errors and its status counted."""

    async def endpoint(request: Request) -> Response:
        request_id = _request_id(request)
        try:
            if not public:
                _authorize(service, request)
            response = await handler(service, request, request_id)
        except Exception as exc:
            error = service.failure(exc)
            if error.code == "internal_error":
                log.exception("[%s] internal error", request_id)
            return _error_response(error, request_id, service)
        response.headers["X-Request-ID"] = request_id
        service.metrics.requests.labels(str(response.status_code)).inc()
        return response

    return endpoint


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]


def _error_response(error: ApiError, request_id: str, service: Service,
                    **extra: Any) -> Response:
    log.info("[%s] %d %s: %s", request_id, error.status, error.code, error.message)
    service.metrics.requests.labels(str(error.status)).inc()
    return JSONResponse({**extra, **error.body(request_id)}, status_code=error.status,
                        headers={**error.headers, "X-Request-ID": request_id})


def _authorize(service: Service, request: Request) -> None:
    if service.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             service.api_key.encode()):
        raise ApiError(401, "unauthorized", "this server needs `Authorization: Bearer KEY`",
                       headers={"WWW-Authenticate": "Bearer"})


async def _healthz(service: Service, request: Request, request_id: str) -> Response:
    return JSONResponse({"status": "ok", "templates": len(service.templates),
                         "running": service.runs.active, "queued": service.runs.queued})


async def _openapi(service: Service, request: Request, request_id: str) -> Response:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("qrun")
    except PackageNotFoundError:  # run from a source tree that is not installed
        release = "0"
    return JSONResponse(openapi(service.descriptions, release))


async def _metrics(service: Service, request: Request, request_id: str) -> Response:
    return Response(generate_latest(service.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)


async def _list(service: Service, request: Request, request_id: str) -> Response:
    return JSONResponse({"templates": service.descriptions})


async def _one(service: Service, request: Request, request_id: str) -> Response:
    name = _template_name(service, request)
    return JSONResponse(next(d for d in service.descriptions if d["name"] == name))


def _template_name(service: Service, request: Request) -> str:
    name = str(request.path_params["name"])
    if name not in service.templates:
        raise ApiError(404, "template_not_found", f"no template named {name[:100]!r} is served")
    return name


async def _run(service: Service, request: Request, request_id: str) -> Response:
    name = _template_name(service, request)
    body = await _read_json(request, service.limits.max_body_bytes)
    run = _run_body(service, name, body, request)
    log.info("[%s] run %s", request_id, name)
    if run.stream:
        return _stream(service, run, request_id)
    ticket = _submit(service, run.request)
    outcome = asyncio.ensure_future(asyncio.wrap_future(ticket.future))
    # A run given up on (timeout, client gone) still ends with an outcome: read, not logged.
    outcome.add_done_callback(lambda f: None if f.cancelled() else f.exception())
    gone = asyncio.ensure_future(_disconnected(request))
    stop = asyncio.ensure_future(service.abandoning.wait())
    waiting: set[asyncio.Future[Any]] = {outcome, gone, stop}
    try:
        done, _ = await asyncio.wait(waiting, timeout=run.timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        stop.cancel()
    if outcome not in done:
        ticket.cancel()
        if stop in done:
            raise service.failure(RunCancelled())
        if gone in done:  # nobody to answer: the run stops at its next forward
            log.info("[%s] the client went away: run cancelled", request_id)
            raise ApiError(499, "client_closed", "the client closed the connection")
        raise ApiError(504, "timeout", f"the run took longer than its timeout "
                       f"({run.timeout} s)")
    if outcome.cancelled():  # taken out of the queue by the drain's end
        raise service.failure(asyncio.CancelledError())
    try:
        result = outcome.result()
    except Exception as exc:
        error = service.failure(exc)
        if error.code == "internal_error":
            log.error("[%s] internal error", request_id, exc_info=exc)
        raise error from None
    return Response(dumps_line(result.row(run.fields)), media_type="application/json")


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body is read already, so the
    next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_json(request: Request, limit: int) -> Any:
    """The body as strict JSON (qrun/jsonio.py), read up to `limit` bytes."""
    data = await _read_body(request, limit)
    try:
        return parse_value(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(400, "bad_request", f"the body is not UTF-8 (byte {exc.start + 1})") \
            from None
    except BadInput as exc:
        raise ApiError(400, "bad_request", f"the body: {exc}") from None


async def _read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, at most `limit` (413 beyond, with or without a Content-Length)."""
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


def _run_body(service: Service, name: str, body: Any, request: Request) -> RunBody:
    """The body of a run request, checked: unknown keys, options and fields are 400; inputs
    that do not fit the template 422 (before the run is admitted)."""
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
    options, timeout = _run_options(given)
    fields = _fields(body.get("fields", list(DEFAULT_FIELDS)))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "bad_request", '"stream" must be true or false')
    stream = stream or "text/event-stream" in request.headers.get("accept", "")
    fill = body.get("fill", {})
    if not isinstance(fill, dict):
        raise ApiError(400, "bad_request", '"fill" must be a JSON object')
    # Sizes first, on the request's own values: the template's checks (its patterns) never
    # scan an oversized string, and a long default of the template is not the client's.
    check_input_sizes(inputs, service.limits)
    check_input_sizes(fill, service.limits, "fill")
    # InputError, UsageError (a name that is no hole): 422, before the run is admitted
    run = service.templates[name].request(inputs, options=options, fill=fill)
    return RunBody(name, run, timeout, stream, fields)


def check_input_sizes(inputs: Mapping[str, Any], limits: ServerLimits,
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
            items = ((f"{place}[{json.dumps(key)}]", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            items = ((f"{place}[{index}]", item) for index, item in enumerate(value))
        else:
            continue
        if depth >= limits.max_input_depth:
            raise ApiError(422, "input_too_large", f"{what} {place} nests lists and objects "
                           f"deeper than {limits.max_input_depth} levels (--max-input-depth)")
        todo.extend((where, item, depth + 1) for where, item in items)


def _run_options(given: dict[str, Any]) -> tuple[RunOptions, float | None]:
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


def _fields(fields: Any) -> tuple[str, ...]:
    if not isinstance(fields, list) or not fields or any(f not in FIELDS for f in fields):
        raise ApiError(400, "bad_request", f'"fields" must be a list among {", ".join(FIELDS)}')
    return tuple(dict.fromkeys(fields))


async def _batch(service: Service, request: Request, request_id: str) -> Response:
    """JSON Lines in, one run per line (the `--inputs` rules, qrun/jsonio.py), JSON Lines
    out in input order, each line sent as soon as it and every line before it are done; a
    line that cannot be a run's inputs, or whose run fails, is an error line
    `{"error", "line"}` and the rest still run (docs/serve.md §2.5). Options come in the
    query string: run options as JSON values, `fields` and `id` as for `qrun --inputs`."""
    name = _template_name(service, request)
    params = dict(request.query_params)
    fields = _fields(params.pop("fields", ",".join(DEFAULT_FIELDS)).split(","))
    id_field = params.pop("id", None)
    given: dict[str, Any] = {}
    for key, value in params.items():
        try:
            given[key] = parse_value(value)
        except BadInput:
            given[key] = value  # a string: RunOptions names what it wanted
    options, timeout = _run_options(given)
    data = await _read_body(request, service.limits.max_body_bytes)
    query = service.templates[name]
    rows = Rows(fields, id_field)
    # (line number, the line's object if it is one, its run or why it has none)
    lines: list[tuple[int, dict[str, Any] | None, RunRequest | str]] = []
    for number, line in split_lines(data):
        parsed: dict[str, Any] | None = None
        try:
            parsed = parse_line(line)
            check_input_sizes(parsed, service.limits)
            lines.append((number, parsed, query.request(parsed, options=options)))
        except ApiError as exc:
            lines.append((number, parsed, exc.message))
        except BadInput as exc:
            lines.append((number, parsed, str(exc)))
        except QrunError as exc:
            lines.append((number, parsed, _message(exc)))
    log.info("[%s] batch %s: %d lines", request_id, name, len(lines))
    # Run k of the lines that are inputs gets item k's seed, as with `qrun --inputs`.
    items = {index: k for k, index in enumerate(
        i for i, (_, _, row) in enumerate(lines) if not isinstance(row, str))}

    async def produce() -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pending: dict[int, asyncio.Future[Any]] = {}
        tickets: list[Ticket] = []
        next_line = 0
        try:
            for index, (number, parsed, row) in enumerate(lines):
                if isinstance(row, str):
                    yield dumps_line(rows.error(f"line {number}: {row}", number, parsed)) + "\n"
                    continue
                # Keep this batch's runs in flight up to the server's slots, in line order.
                while next_line < len(lines) and len(pending) < service.limits.max_running:
                    run = lines[next_line][2]
                    if not isinstance(run, str):
                        try:
                            ticket = await _admit(service, run.for_item(items[next_line]),
                                                  pending)
                        except RunCancelled as exc:  # the drain's end: no more runs
                            pending[next_line] = loop.create_future()
                            pending[next_line].set_exception(exc)
                        else:
                            tickets.append(ticket)
                            pending[next_line] = asyncio.wrap_future(ticket.future)
                    next_line += 1
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    result = await _unless_abandoned(service, pending[index], left)
                    line = rows.result(result, parsed)
                except TimeoutError:
                    error = ApiError(504, "timeout", f"the batch took longer than its "
                                     f"timeout ({timeout} s)")
                    line = rows.error(error.message, number, parsed)
                except (Exception, asyncio.CancelledError) as exc:
                    if isinstance(exc, asyncio.CancelledError) and not pending[index].cancelled():
                        raise  # this stream's own task is cancelled: its client went away
                    failure = service.failure(exc)
                    line = rows.error(f"line {number}: {failure.message}", number, parsed,
                                      failure.code)
                pending.pop(index, None)
                yield dumps_line(line) + "\n"
        finally:
            for ticket in tickets:
                ticket.cancel()

    return StreamingResponse(produce(), media_type="application/x-ndjson")


async def _unless_abandoned(service: Service, future: asyncio.Future[Any],
                            timeout: float | None) -> Any:
    """`future`'s result, waited for up to `timeout` seconds (then TimeoutError) and until
    the service abandons its runs (then RunCancelled). A task of this request's own (a
    stream's next event) is cancelled when it is not done; a run's future is left to it."""
    stop = asyncio.ensure_future(service.abandoning.wait())
    try:
        done, _ = await asyncio.wait({future, stop}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if isinstance(future, asyncio.Task) and not future.done():
            future.cancel()  # also when this request's own task is cancelled (client gone)
    if future in done:
        return future.result()
    if stop in done:
        raise RunCancelled
    raise TimeoutError


async def _admit(service: Service, run: RunRequest,
                 pending: Mapping[int, asyncio.Future[Any]]) -> Ticket:
    """Submit a batch line's run, waiting for one of the batch's own runs to end (or, with
    none in flight, a moment) while the queue is full."""
    while True:
        try:
            return _submit(service, run)
        except ApiError:
            if pending:
                await asyncio.wait(list(pending.values()), return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(0.05)


def _submit(service: Service, run: RunRequest) -> Ticket:
    """Admit `run` to the server's runs (429 when the queue is full); its outcome is counted
    in the metrics as it ends."""
    try:
        ticket = service.runs.submit(run)
    except QueueFull as exc:
        raise ApiError(429, "queue_full", str(exc),
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    ticket.future.add_done_callback(service.metrics.ended)
    return ticket


def _stream(service: Service, run: RunBody, request_id: str) -> Response:
    """Server-sent events: `text` chunks as the run produces them, `hole` as each hole ends,
    then `done` (the result row) or `error` (docs/serve.md §2.3)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def push(kind: str, data: Any) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (kind, data))

    ticket = _submit(service, run.request.streaming(
        lambda text: push("text", {"text": text}),
        lambda name, value: push("hole", {"name": name, "value": value})))
    # After every text and hole event: the run's thread pushed those before its future ended.
    ticket.future.add_done_callback(lambda future: push("end", future))

    async def produce() -> AsyncIterator[dict[str, str]]:
        deadline = None if run.timeout is None else loop.time() + run.timeout
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                event = asyncio.ensure_future(events.get())
                try:
                    kind, data = await _unless_abandoned(service, event, left)
                except RunCancelled as exc:
                    error = service.failure(exc)
                    yield {"event": "error", "data": dumps_line(error.body(request_id))}
                    return
                except TimeoutError:
                    ticket.cancel()
                    error = ApiError(504, "timeout", f"the run took longer than its timeout "
                                     f"({run.timeout} s)")
                    yield {"event": "error", "data": dumps_line(error.body(request_id))}
                    return
                if kind != "end":
                    yield {"event": kind, "data": dumps_line(data)}
                    continue
                if data.cancelled():
                    error = (service.failure(asyncio.CancelledError()) if service.abandoned
                             else ApiError(503, "cancelled", "the run was cancelled"))
                elif data.exception() is not None:
                    error = service.failure(data.exception())
                    if error.code == "internal_error":
                        log.error("[%s] internal error", request_id, exc_info=data.exception())
                else:
                    row = data.result().row(run.fields)
                    yield {"event": "done", "data": dumps_line(row)}
                    return
                log.info("[%s] stream error %s", request_id, error.code)
                yield {"event": "error", "data": dumps_line(error.body(request_id))}
                return
        finally:
            ticket.cancel()  # a client gone away: the run stops at its next forward

    return EventSourceResponse(produce(), headers={"X-Request-ID": request_id})
