"""A real uvicorn server in a background thread on a free port, for the server tests; and a
gate that host functions of test templates wait at, so a test decides when runs go on."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette

from tests.hang import alarm


@contextmanager
def serving(asgi: Starlette) -> Iterator[str]:
    """Serve `asgi` on 127.0.0.1 (a port the system picks) for the block; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        with alarm(60):
            wait_until(lambda: server.started)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with alarm(60):
            thread.join()
        sock.close()


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll `condition` (callers hold an alarm: a regression fails instead of hanging)."""
    while not condition():
        time.sleep(0.01)


class Gate:
    """A host function, `wait()`, that blocks each run calling it until the test opens the
    gate; `arrived` counts the runs that reached it."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.lock = threading.Lock()
        self.arrived = 0

    def wait(self) -> str:
        with self.lock:
            self.arrived += 1
        self.open.wait()
        return ""

    def reset(self) -> None:
        self.open.clear()
        with self.lock:
            self.arrived = 0


def sse_events(lines: Iterator[str]) -> list[tuple[str, Any]]:
    """The (event, JSON data) pairs of a server-sent event stream, comments left out."""
    events: list[tuple[str, Any]] = []
    kind, data = "message", []
    for line in lines:
        if not line:
            if data:
                events.append((kind, json.loads("\n".join(data))))
            kind, data = "message", []
        elif line.startswith("event:"):
            kind = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").removeprefix(" "))
    return events
