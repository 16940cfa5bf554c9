"""A real uvicorn server in a background thread on a free port, for the server tests; a gate
that host functions of test templates wait at, so a test decides when runs go on (GATE, and
conftest.py's `gate` fixture that resets it); and the template the backend tiers serve
(test_serve_llamacpp.py, test_serve_vllm.py): a person extracted as JSON from a bio, after
the gate."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from qrun.serve.connections import bounded_config
from tests.hang import alarm, wait_until


@contextmanager
def serving(asgi: Starlette, **bounds: Any) -> Iterator[str]:
    """Serve `asgi` on 127.0.0.1 (a port the system picks) for the block, on the bounded
    connections `qrun serve` has (qrun/serve/connections.py; `bounds`: header_timeout,
    max_connections); yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(bounded_config(asgi, log_level="warning", lifespan="on", **bounds))
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


GATE = Gate()
"""The gate of the test templates' `wait()` (conftest.py's `gate` fixture resets it)."""

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
EXTRACT = ("{% user %}Give the person as JSON.\n{{ bio }}{{ wait() }}{% enduser %}\n"
           "{% assistant %}{{ gen person json=" + json.dumps(SCHEMA)
           + " max_tokens=40 }}{% endassistant %}\n")
BIOS = ["Kofi is a 25-year-old baker from Lagos.", "Mei, 31, is a nurse in Taipei.",
        "Lars is 47 and builds boats in Bergen."]


def post_extract(url: str, body: Any) -> httpx.Response:
    """A run of the template served as "extract" (EXTRACT)."""
    return httpx.post(f"{url}/v1/templates/extract/run", json=body, timeout=300)
