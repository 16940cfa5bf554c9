"""What the handlers of `qrun serve` share (qrun/serve/application.py): the served templates,
the model's runner with this server's admission, the metrics and the drain state; and the
error response every handler and the drain middleware answer with."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from qrun.api import Query
from qrun.errors import HostFunctionError, RunCancelled
from qrun.serve.catalog import describe
from qrun.serve.protocol import (
    RETRY_AFTER_S,
    ApiError,
    ServeOptions,
    api_error,
    request_id_of,
)

if TYPE_CHECKING:  # the runtime and backends are reached through Query, never imported here
    from qrun.backends.base import Backend
    from qrun.runtime.result import Result
    from qrun.runtime.runner import Admission


log = logging.getLogger("qrun.serve")


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

    def __init__(self, templates: Mapping[str, Query], backend: Backend, limits: ServeOptions,
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
        # The name each template file is served under, by its path: an error's position
        # names no path of this machine (issue #38).
        self.shown_names = {query.program.source.name: f"{name}.tmpl"
                            for name, query in self.templates.items()
                            if not query.program.source.name.startswith("<")}
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

    def failure(self, exc: BaseException, request_id: str = "-") -> ApiError:
        """The answer to a run's failure: a run cancelled by `abandon` is 503 `draining`,
        not the 504 of a request's own deadline. A host function's failure is answered with
        its name only; its text goes to the log, with the request's id."""
        if self.abandoned and isinstance(exc, RunCancelled | asyncio.CancelledError):
            return ApiError(503, "draining", "the server shut down before this run ended "
                            "(its --drain-timeout passed)",
                            headers={"Retry-After": str(RETRY_AFTER_S)})
        if isinstance(exc, HostFunctionError):
            log.warning("[%s] %s", request_id, exc.render())
        return api_error(exc, self.shown_names)


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
            response = error_response(error, request_id_of(request), self.service, extra)
            await response(scope, receive, send)
            return
        self.service.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.service.in_flight -= 1


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""The names a server on this machine is reached by, allowed in `Host` by default."""


def host_name(header: str) -> str:
    """The name in a `Host` header, without its port, lower case ("[::1]:8000" -> "::1")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostGate:
    """ASGI middleware: a request whose `Host` is not a name this server answers to is
    refused 400 `bad_host` before anything else reads it. Why: a page on another site whose
    DNS name is made to resolve to 127.0.0.1 (DNS rebinding) is, to the browser, same-origin
    with this server, so it could run templates and read the answers; its requests still
    carry its own name in `Host` (issue #38). `allowed` None: any name (a server bound to
    every interface, with no names given)."""

    def __init__(self, app: ASGIApp, service: Service, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.service = service
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        name = host_name(headers.get(b"host", b"").decode("latin-1"))
        if name in self.allowed:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        shown = repr(name[:100]) if name else "no Host header"
        error = ApiError(400, "bad_host", f"this server does not answer to {shown} "
                         "(qrun serve --allow-host NAME adds a name)")
        await error_response(error, request_id_of(request), self.service)(scope, receive, send)


def error_response(error: ApiError, request_id: str, service: Service,
                   extra: Mapping[str, Any] | None = None,
                   body: Mapping[str, Any] | None = None) -> Response:
    """`error` answered: qrun's body (docs/serve.md §4) with `extra`, or `body` instead."""
    log.info("[%s] %d %s: %s", request_id, error.status, error.code, error.message)
    service.metrics.requests.labels(str(error.status)).inc()
    return JSONResponse(body if body is not None else {**(extra or {}),
                                                       **error.body(request_id)},
                        status_code=error.status,
                        headers={**error.headers, "X-Request-ID": request_id})


def template_name(service: Service, request: Request) -> str:
    name = str(request.path_params["name"])
    if name not in service.templates:
        raise ApiError(404, "template_not_found", f"no template named {name[:100]!r} is served")
    return name
