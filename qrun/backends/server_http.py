"""The HTTP client of the vLLM server adapter (backends/vllm_server.py): one kept httpx client
per connected server (a pool of keep-alive connections, shared by the branches of a run and by
the runs of a batch, which send their requests concurrently), timeouts as the OpenAI SDK sets
them (a short connect, a long read), and retries with backoff where a request can safely be
sent again. What comes back is bytes until it parses as a JSON object of bounded size; what
the object means is the adapter's to check.

Why these numbers: the openai SDK (openai/_constants.py) waits 600 s for a read and 5 s for a
connection, and retries twice with exponential backoff from 0.5 s capped at 8 s, on connection
errors and on 408/409/429/5xx. A completion here is idempotent (it changes nothing on the
server but its prefix cache), so it is retried on connection errors and on the statuses that
mean "not now" (429, 502, 503, 504); a 500 is the server's own failure and is reported at once.
"""

from __future__ import annotations

import json
import random
import time
import weakref
from typing import Any

import httpx

from qrun.errors import BackendError

# A request waits this long (seconds between bytes of the answer) unless told otherwise: the
# openai SDK's default. A busy CPU server queues requests, and a hole of 128 tokens behind 15
# others takes minutes there (issue #38: 30 s failed the suite on a loaded machine).
REQUEST_TIMEOUT_S = 600.0
# A connection that is not made in this long is a server that is not there.
CONNECT_TIMEOUT_S = 5.0
# A reply larger than this is not a completion of one hole.
MAX_REPLY_BYTES = 64 << 20
# Retries of a request that may be sent again (the openai SDK's default count and backoff).
MAX_RETRIES = 2
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 8.0
# The statuses that say "try again later" (a proxy with no upstream yet, a full queue).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Connections kept per server: a batch of 16 runs each with a few branches in flight.
MAX_CONNECTIONS = 64


class ServerError(BackendError):
    """The server refused or failed a request (the message carries its own); `status` is the
    HTTP status of a refusal."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerClient:
    """Requests to one server at `base_url`, each answered by a JSON object or a ServerError.
    Thread-safe (httpx's client and pool are); `close()` ends the kept connections."""

    def __init__(self, base_url: str, timeout: float = REQUEST_TIMEOUT_S,
                 retries: int = MAX_RETRIES) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT_S, timeout)),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS,
                                max_keepalive_connections=MAX_CONNECTIONS),
            # A redirect would carry the request (and any credentials) to another host.
            follow_redirects=False,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
            trust_env=False,  # loopback and cluster addresses: no proxy from the environment
        )
        # A backend dropped without close() still ends its connections (no unclosed-socket
        # warnings in a script that never calls close()).
        self._finalizer = weakref.finalize(self, self._http.close)

    def get(self, path: str) -> dict[str, Any]:
        return self._send("GET", path, None)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` as JSON; every request qrun sends a server is idempotent (completions
        and scores change nothing but its caches), so each may be retried."""
        return self._send("POST", path, body)

    def close(self) -> None:
        self._finalizer()  # closes once, however often called

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = self.base_url + path
        content = json.dumps(body).encode() if body is not None else None
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                status, payload, retry_after = self._exchange(method, url, content)
            except httpx.TimeoutException as exc:
                if isinstance(exc, httpx.ConnectTimeout) and not last:
                    self._pause(attempt, None)
                    continue
                raise ServerError(f"the vLLM server at {url} did not answer within "
                                  f"{self._late_bound(exc):g} s (--timeout / "
                                  "load_model(timeout=) sets the limit)") from None
            except (httpx.TransportError, OSError) as exc:
                # Refused, reset, closed mid-answer: nothing usable came back.
                if not last:
                    self._pause(attempt, None)
                    continue
                raise ServerError(f"cannot reach the vLLM server at {url}: "
                                  f"{_reason(exc)}") from None
            if status in RETRY_STATUSES and not last:
                self._pause(attempt, retry_after)
                continue
            if status >= 300:
                what = ("a redirect to " + _short(retry_after or "?") if 300 <= status < 400
                        else _server_message(payload))
                raise ServerError(f"the vLLM server at {url} answered {status}: {what}",
                                  status)
            return _json_object(url, payload)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _exchange(self, method: str, url: str, content: bytes | None
                  ) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After or Location) of one request; a body over the bound is
        an error before it is all read."""
        if not self._finalizer.alive:
            raise ServerError(f"the connection to the vLLM server at {url} is closed")
        with self._http.stream(method, url, content=content) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_REPLY_BYTES:
                    raise ServerError(f"the vLLM server at {url} answered with more than "
                                      f"{MAX_REPLY_BYTES >> 20} MB", response.status_code)
                chunks.append(chunk)
            header = ("location" if 300 <= response.status_code < 400 else "retry-after")
            return response.status_code, b"".join(chunks), response.headers.get(header)

    def _late_bound(self, exc: httpx.TimeoutException) -> float:
        return min(CONNECT_TIMEOUT_S, self.timeout) if isinstance(
            exc, httpx.ConnectTimeout) else self.timeout

    @staticmethod
    def _pause(attempt: int, retry_after: str | None) -> None:
        """Exponential backoff with jitter (as the openai SDK), or the server's Retry-After
        when it gives seconds within the cap."""
        wait = min(RETRY_FIRST_S * 2 ** attempt, RETRY_MAX_S) * (1 - 0.25 * random.random())
        if retry_after is not None:
            try:
                asked = float(retry_after)
            except ValueError:
                asked = -1.0
            if 0 <= asked <= RETRY_MAX_S:
                wait = asked
        time.sleep(wait)


def _json_object(url: str, payload: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(payload or b"{}", parse_constant=_no_constants)
    except (ValueError, RecursionError):  # JSONDecodeError, NaN/Infinity, bad UTF-8, depth
        raise ServerError(f"the vLLM server at {url} did not answer with JSON") from None
    if not isinstance(reply, dict):
        raise ServerError(f"the vLLM server at {url} answered with JSON that is not an object")
    return reply


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return _short(text)


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


def _server_message(payload: bytes) -> str:
    try:
        reply = json.loads(payload)
    except (ValueError, RecursionError):
        return _short(payload[:300].decode("utf-8", errors="replace"))
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, dict):
        return _short(str(error.get("message", error)))
    return _short(str(reply.get("message", reply)) if isinstance(reply, dict) else str(reply))
