"""The HTTP connections of `qrun serve`, bounded (issue #38: 300 connections sending their
headers a byte at a time were all still open after 60 s, 1,200 of them took every file
descriptor of the process, and a 128 MiB header was read to its end while /healthz waited).

uvicorn's h11 protocol with three bounds of its own: the header block is at most
MAX_HEADER_BYTES (h11's incomplete-event limit; uvicorn's default httptools parser has none),
each request's headers must have arrived `header_timeout` seconds after the connection opened
or the previous response ended (uvicorn has no such timer, and any byte resets its keep-alive
one), and a connection beyond `max_connections` is closed as it is accepted, so descriptors
stay bounded. The body's own time is the app's (protocol.read_body)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("qrun.serve")

MAX_HEADER_BYTES = 64 << 10
"""The largest request line and header block read (nginx's default is 8-32 KiB; a bearer
key and a request id fit many times over)."""
HEADER_TIMEOUT_S = 10.0
"""How long a request's headers may take to arrive (nginx: client_header_timeout 60 s; 10 s
is ample on loopback and a LAN, and frees a slowloris connection soon)."""
MAX_CONNECTIONS = 512
"""Open connections at most: half the usual 1,024 descriptors, the rest for the model's
files, logs and the runs' threads."""


def bounded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline and a bound on open connections."""

    class Bounded(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                # Refused as it comes: a descriptor held for nothing is what a flood wants.
                log.warning("%d connections are open (--max-connections): one more closed",
                            len(self.connections))
                transport.abort()
                return
            super().connection_made(transport)
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # this request's headers are in
                self._headers_arrived()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._await_headers()  # the next request on a kept connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_arrived()
            if self.transport is not None:  # None: refused in connection_made
                super().connection_lost(exc)

        def _await_headers(self) -> None:
            self._headers_arrived()
            self.header_deadline = self.loop.call_later(header_timeout, self._too_slow)

        def _headers_arrived(self) -> None:
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

        def _too_slow(self) -> None:
            self.header_deadline = None
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                log.info("a connection's request headers took over %g s: closed",
                         header_timeout)
                self.transport.close()

    return Bounded


def bounded_config(asgi: Starlette, host: str = "127.0.0.1", port: int = 8000, *,
                   header_timeout: float = HEADER_TIMEOUT_S,
                   max_connections: int = MAX_CONNECTIONS, **options: Any) -> uvicorn.Config:
    """uvicorn's Config for `asgi` on the bounded protocol (`options`: uvicorn's own)."""
    return uvicorn.Config(asgi, host=host, port=port,
                          http=bounded_protocol(header_timeout, max_connections),
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, **options)
