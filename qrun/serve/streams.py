"""Serving the runs of `qrun serve` (docs/serve.md §2.2-§2.5): one run answered whole or as
server-sent events, a JSON Lines batch answered line by line in input order; each run admitted
to the server's admission of the model's runner (qrun/runtime/runner.py), waited for under its
timeout, the client's disconnection and the drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from qrun.errors import (
    QrunError,
    QueueFull,
    RunCancelled,
)
from qrun.jsonio import (
    DEFAULT_FIELDS,
    BadInput,
    Rows,
    dumps_line,
    parse_line,
    parse_value,
    split_lines,
)
from qrun.serve.protocol import (
    JSON_LINES_TYPES,
    RETRY_AFTER_S,
    ApiError,
    RunBody,
    check_input_sizes,
    fields_of,
    message_of,
    read_body,
    read_json,
    require_media_type,
    run_body,
    run_options,
)
from qrun.serve.service import Service, log, template_name

if TYPE_CHECKING:  # the runtime and backends are reached through Query, never imported here
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result
    from qrun.runtime.runner import Ticket


# A batch line waiting for a place in a full queue tries again after this long, doubling.
ADMIT_POLL_FIRST_S = 0.05
ADMIT_POLL_MAX_S = 0.5


async def answer_run(service: Service, request: Request, request_id: str) -> Response:
    name = template_name(service, request)
    body = await read_json(request, service.limits)
    run = run_body(service.templates[name], name, service.limits, body, request)
    log.info("[%s] run %s", request_id, name)
    if run.stream:
        return _stream(service, run, request_id)
    result = await outcome_of(service, request, submit(service, run.request), run.timeout,
                              request_id)
    return Response(dumps_line(result.row(run.fields)), media_type="application/json")


async def outcome_of(service: Service, request: Request, ticket: Ticket,
                     timeout: float | None, request_id: str) -> Result:
    """The result of `ticket`'s run, waited for up to `timeout` seconds, while the client
    stays and the server does not abandon its runs; a run given up on is cancelled.

    Raises:
        ApiError: 504 past the timeout, 499 the client gone, the run's failure as answered.
    """
    outcome = asyncio.ensure_future(asyncio.wrap_future(ticket.future))
    # A run given up on (timeout, client gone) still ends with an outcome: read, not logged.
    outcome.add_done_callback(_read_outcome)
    gone = asyncio.ensure_future(_disconnected(request))
    stop = asyncio.ensure_future(service.abandoning.wait())
    waiting: set[asyncio.Future[Any]] = {outcome, gone, stop}
    try:
        done, _ = await asyncio.wait(waiting, timeout=timeout,
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
        raise ApiError(504, "timeout", f"the run took longer than its timeout ({timeout} s)")
    if outcome.cancelled():  # taken out of the queue by the drain's end
        raise service.failure(asyncio.CancelledError())
    try:
        result: Result = outcome.result()
    except Exception as exc:
        error = service.failure(exc, request_id)
        if error.code == "internal_error":
            log.error("[%s] internal error", request_id, exc_info=exc)
        raise error from None
    return result


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body is read already, so the
    next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def answer_batch(service: Service, request: Request, request_id: str) -> Response:
    """JSON Lines in, one run per line (the `--inputs` rules, qrun/jsonio.py), JSON Lines
    out in input order, each line sent as soon as it and every line before it are done; a
    line that cannot be a run's inputs, or whose run fails, is an error line
    `{"error", "line"}` and the rest still run (docs/serve.md §2.5). Options come in the
    query string: run options as JSON values, `fields` and `id` as for `qrun --inputs`."""
    name = template_name(service, request)
    params = dict(request.query_params)
    fields = fields_of(params.pop("fields", ",".join(DEFAULT_FIELDS)).split(","))
    id_field = params.pop("id", None)
    given: dict[str, Any] = {}
    for key, value in params.items():
        try:
            given[key] = parse_value(value)
        except BadInput:
            given[key] = value  # a string: RunOptions names what it wanted
    options, timeout = run_options(given)
    require_media_type(request, JSON_LINES_TYPES)
    data = await read_body(request, service.limits)
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
            lines.append((number, parsed, message_of(exc)))
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
                            # A run given up on (a timeout, a client gone) still ends, most
                            # with RunCancelled: read, never logged as "Future exception was
                            # never retrieved" (issue #38).
                            pending[next_line].add_done_callback(_read_outcome)
                    next_line += 1
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    result = await unless_abandoned(service, pending[index], left)
                    line = rows.result(result, parsed)
                except TimeoutError:
                    error = ApiError(504, "timeout", f"the batch took longer than its "
                                     f"timeout ({timeout} s)")
                    line = rows.error(error.message, number, parsed, error.code)
                except (Exception, asyncio.CancelledError) as exc:
                    if isinstance(exc, asyncio.CancelledError) and not pending[index].cancelled():
                        raise  # this stream's own task is cancelled: its client went away
                    failure = service.failure(exc, request_id)
                    line = rows.error(f"line {number}: {failure.message}", number, parsed,
                                      failure.code)
                pending.pop(index, None)
                yield dumps_line(line) + "\n"
        finally:
            for ticket in tickets:
                ticket.cancel()

    return StreamingResponse(produce(), media_type="application/x-ndjson")


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def ended(service: Service, future: Future[Any], request_id: str) -> ApiError | None:
    """Why the run of `future` (ended) has no result, as a stream answers it, or None when it
    has one: cancelled by the drain's end or by the client, or its failure (an internal one
    logged with the request's id)."""
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


async def unless_abandoned(service: Service, future: asyncio.Future[Any],
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
    """Submit a batch line's run, waiting while the queue is full for one of the batch's own
    runs still in flight to end, or (other requests hold the slots) a pause that doubles up to
    ADMIT_POLL_MAX_S. Only runs not yet ended are waited on: one that ended but is not yet
    answered would wake the loop at once, every time (issue #38: 25,654 tries in 3 s)."""
    pause = ADMIT_POLL_FIRST_S
    while True:
        try:
            return submit(service, run)
        except ApiError:
            running = [f for f in pending.values() if not f.done()]
            if running:
                await asyncio.wait(running, timeout=ADMIT_POLL_MAX_S,
                                   return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(pause)
                pause = min(2 * pause, ADMIT_POLL_MAX_S)


def submit(service: Service, run: RunRequest) -> Ticket:
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

    ticket = submit(service, run.request.streaming(
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
                    kind, data = await unless_abandoned(service, event, left)
                except RunCancelled as exc:
                    error = service.failure(exc, request_id)
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
                failed = ended(service, data, request_id)
                if failed is None:
                    row = data.result().row(run.fields)
                    yield {"event": "done", "data": dumps_line(row)}
                    return
                log.info("[%s] stream error %s", request_id, failed.code)
                yield {"event": "error", "data": dumps_line(failed.body(request_id))}
                return
        finally:
            ticket.cancel()  # a client gone away: the run stops at its next forward

    return EventSourceResponse(produce(), headers={"X-Request-ID": request_id})
