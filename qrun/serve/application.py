"""The ASGI app of `qrun serve` (docs/serve.md): templates as HTTP endpoints on one model, the
runs of every request admitted to the model's runner (qrun/runtime/runner.py, through
`Query.request` and `Query.runner`, as a Python user runs them) and batched together. Errors
are JSON with a stable code (docs/serve.md §4), never a traceback; every response carries the
request's id, and so do the log lines about it. The routes are here; the wire format is
serve/protocol.py, the shared state serve/service.py, the answering of runs serve/streams.py."""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from qrun.api import HostFunctions, Query
from qrun.errors import UsageError
from qrun.options import ModelOptions
from qrun.serve.catalog import served
from qrun.serve.openai import COMPLETE, chat_completions, chat_template, list_models
from qrun.serve.openai_errors import openai_error
from qrun.serve.openapi import openapi
from qrun.serve.protocol import (
    BODY_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_INPUT_CHARS,
    MAX_INPUT_DEPTH,
    ApiError,
    ServeOptions,
    request_id_of,
)
from qrun.serve.service import (
    LOOPBACK_HOSTS,
    DrainGate,
    HostGate,
    Service,
    error_response,
    host_name,
    log,
    template_name,
)
from qrun.serve.streams import answer_batch, answer_run

if TYPE_CHECKING:  # the runtime and backends are reached through Query, never imported here
    from qrun.backends.base import Backend


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
    body_timeout_s: int = BODY_TIMEOUT_S,
    api_key: str | None = None,
    allowed_hosts: Iterable[str] | None = LOOPBACK_HOSTS,
) -> Starlette:
    """The ASGI app serving `templates` (name -> Query, or `.tmpl` files and folders, compiled
    with `functions`) on `model` (a loaded backend, or what `load_model` takes: loaded now).
    `api_key`: requests must carry `Authorization: Bearer KEY`. `max_input_chars`,
    `max_input_depth`: the largest input a request may give (check_input_sizes);
    `body_timeout_s`: how long its body may take to arrive (read_body).
    `allowed_hosts`: the names a request's `Host` may give (HostGate; default this machine's
    loopback names; "*" among them, or None: any).

    Raises:
        UsageError: a bad limit, a missing template file or two templates with one name.
        TemplateErrors: a template does not compile.
        ModelLoadError: the model cannot be loaded.
    """
    limits = ServeOptions(max_running, max_queue, max_body_bytes, max_input_chars,
                          max_input_depth, body_timeout_s)
    if api_key is not None and api_key != "" and not _KEY.fullmatch(api_key):
        raise UsageError("the API key must be printable ASCII with no spaces (a key with a "
                         "space at either end would never match what clients send)")
    hosts = None if allowed_hosts is None else frozenset(host_name(h) for h in allowed_hosts)
    if hosts is not None and "*" in hosts:
        hosts = None
    queries = served(templates, functions)
    if not queries:
        raise UsageError("no template to serve")
    backend = _backend(model, queries)
    service = Service(queries, backend, limits, api_key or None)
    chat, complete = Query(chat_template(backend.tool_call_format())), Query(COMPLETE)

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
        return error_response(ApiError(status, code, f"{request.method} {request.url.path}: "
                                        f"{'no such endpoint' if status == 404 else code}"),
                               request_id_of(request), service)

    routes = [
        Route("/healthz", _handler(service, _healthz, public=True), methods=["GET"]),
        Route("/openapi.json", _handler(service, _openapi), methods=["GET"]),
        Route("/metrics", _handler(service, _metrics), methods=["GET"]),
        Route("/v1/templates", _handler(service, _list), methods=["GET"]),
        Route("/v1/templates/{name}", _handler(service, _one), methods=["GET"]),
        Route("/v1/templates/{name}/run", _handler(service, answer_run), methods=["POST"]),
        Route("/v1/templates/{name}/batch", _handler(service, answer_batch), methods=["POST"]),
        # OpenAI's API (serve/openai.py): its own error shape, the same key and limits.
        Route("/v1/models", _handler(service, list_models, openai=True), methods=["GET"]),
        Route("/v1/chat/completions", _handler(service, partial(chat_completions, chat=chat),
                                               openai=True), methods=["POST"]),
        Route("/v1/completions", _handler(service, partial(
            chat_completions, chat=complete, legacy=True), openai=True), methods=["POST"]),
    ]
    starlette = Starlette(routes=routes, lifespan=lifespan,
                          middleware=[Middleware(HostGate, service=service, allowed=hosts),
                                      Middleware(DrainGate, service=service)],
                          exception_handlers={HTTPException: not_found})
    starlette.state.qrun = service
    return starlette


_KEY = re.compile(r"[\x21-\x7e]+")


def _backend(model: Backend | ModelOptions | str | None,
             queries: Mapping[str, Query]) -> Backend:
    if model is None or isinstance(model, str):
        options = ModelOptions(model=model)
    elif isinstance(model, ModelOptions):
        options = model
    else:
        return model
    # One model serves every template: the first template's front matter fills in what the
    # caller left open (docs/serve.md §3); the weights when any template has a hole (issue
    # #38: a first template without holes loaded the tokenizer alone, and every other
    # template failed), unless the caller said.
    if options.weights is None:
        options = replace(options, weights=any(q.program.captures for q in queries.values()))
    return next(iter(queries.values())).load(options=options)


Handler = Callable[[Service, Request, str], Awaitable[Response]]


def _handler(service: Service, handler: Handler, public: bool = False,
             openai: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """`handler` with the request's id, its key checked (unless `public`), its failures
    answered as JSON errors (in OpenAI's shape where `openai`) and its status counted."""

    async def endpoint(request: Request) -> Response:
        request_id = request_id_of(request)
        try:
            if not public:
                _authorize(service, request)
            response = await handler(service, request, request_id)
        except Exception as exc:
            error = service.failure(exc, request_id)
            if error.code == "internal_error":
                log.exception("[%s] internal error", request_id)
            if openai:
                return error_response(error, request_id, service, body=openai_error(error))
            return error_response(error, request_id, service)
        response.headers["X-Request-ID"] = request_id
        service.metrics.requests.labels(str(response.status_code)).inc()
        return response

    return endpoint


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
    name = template_name(service, request)
    return JSONResponse(next(d for d in service.descriptions if d["name"] == name))
