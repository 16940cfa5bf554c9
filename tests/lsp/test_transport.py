"""`qrun lsp`'s transport under malformed input (issue #38 item 6; qrun/lsp/transport.py): the
server is started as an editor starts it and spoken to byte by byte over its stdio, since the
messages here are ones no protocol library would send. A message whose Content-Length is not a
number is dropped and the next one is served; a request whose params do not fit its method is
answered InvalidParams instead of never. Waits are for answers, bounded (HANG_S)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 60
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
INVALID_PARAMS = -32602


class RawClient:
    """Frames and writes messages to the server's stdin; a thread reads its answers."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def send_raw(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.send_raw(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def answer(self, request_id: int) -> dict[str, Any]:
        """The response to request `request_id` (notifications and others skipped)."""
        while True:
            message = self.answers.get(timeout=HANG_S)
            if message.get("id") == request_id and "method" not in message:
                return message

    def _read(self) -> None:
        out: IO[bytes] | None = self.process.stdout
        assert out is not None
        while True:
            length = 0
            while (line := out.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line:
                return
            self.answers.put(json.loads(out.read(length)))


@pytest.fixture
def client() -> Iterator[RawClient]:
    process = subprocess.Popen([sys.executable, "-m", "qrun.cli", "lsp"], env=ENV,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    client = RawClient(process)
    client.send({"id": 1, "method": "initialize",
                 "params": {"processId": None, "rootUri": None, "capabilities": {}}})
    assert "capabilities" in client.answer(1)["result"]
    client.send({"method": "initialized", "params": {}})
    try:
        yield client
    finally:
        process.kill()
        process.wait(timeout=HANG_S)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def test_a_content_length_that_is_no_number_drops_that_message_only(client: RawClient) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "shutdown"}).encode()
    client.send_raw(b"Content-Length: seven\r\n\r\n" + body)
    client.send_raw(b"Content-Length: 12x\r\n\r\n" + body)
    client.send_raw(b"this is no header\r\n\r\n" + body)
    # The next well-formed requests are each answered.
    client.send({"id": 8, "method": "textDocument/documentSymbol",
                 "params": {"textDocument": {"uri": "untitled:a"}}})
    assert "result" in client.answer(8)
    client.send({"id": 9, "method": "shutdown"})
    assert client.answer(9)["result"] is None


@pytest.mark.parametrize("method, params", [
    ("textDocument/hover", {}),
    ("textDocument/completion", {"textDocument": {"uri": "file:///a.tmpl"}}),
    ("textDocument/definition", {"textDocument": 3, "position": {"line": 0, "character": 0}}),
    ("textDocument/documentSymbol", None),
])
def test_a_request_with_params_it_cannot_read_is_answered_invalid_params(
        client: RawClient, method: str, params: Any) -> None:
    client.send({"id": 5, "method": method, "params": params})
    answer = client.answer(5)
    assert answer["error"]["code"] == INVALID_PARAMS, answer
    client.send({"id": 6, "method": "shutdown"})  # and the server goes on
    assert client.answer(6)["result"] is None
