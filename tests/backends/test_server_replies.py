"""A vLLM server's replies are data, not trusted (backends/vllm_server.py): a server answering
with wrong types, token ids outside the vocabulary, non-numeric log-probabilities or no JSON at
all gives a GenerationError at the hole naming the server, and one that never answers times
out. The server here is a small HTTP stand-in on 127.0.0.1 (the real one: tests/test_vllm.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import qrun

Reply = Callable[[], tuple[int, bytes]]


class _Handler(BaseHTTPRequestHandler):
    reply: Reply

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._send(200, json.dumps({"data": [{"id": "m", "max_model_len": 8192}]}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/tokenize":
            self._send(404, b'{"error": "no such route"}')
        elif b"%llguidance {}" in body:  # connect's probe (vllm_server.py): a llguidance server
            self._send(200, json.dumps({"choices": [{"index": 0, "finish_reason": "length",
                                                     "token_ids": [64]}]}).encode())
        else:
            self._send(*type(self).reply())

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the timeout test's client hangs up before the slow answer is written


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Callable[[Reply], None]]]:
    handler = type("Handler", (_Handler,), {"reply": staticmethod(lambda: (200, b"{}"))})
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def answer(reply: Reply) -> None:
        handler.reply = staticmethod(reply)  # type: ignore[attr-defined]

    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answer
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def model(server: tuple[str, Callable[[Reply], None]]) -> Any:
    return qrun.load_model("smollm2", backend="vllm", url=server[0], timeout=5)


def completion(**choice: Any) -> Reply:
    body = json.dumps({"choices": [{"index": 0, "finish_reason": "length", **choice}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    return lambda: (200, body.encode())


@pytest.mark.parametrize("reply, message", [
    (completion(token_ids=[10, 99_999_999]), "outside the vocabulary"),
    (completion(token_ids=[10, -1]), "outside the vocabulary"),
    (completion(token_ids=["10", "11"]), "not a list of integers"),
    (completion(token_ids=[10, True]), "not a list of integers"),
    (completion(token_ids=7), "not a list of integers"),
    (completion(token_ids=[10, 11], logprobs={"token_logprobs": ["high", -1.0]}),
     "not a number"),
    (completion(token_ids=[10, 11], logprobs={"token_logprobs": [0.5, -1.0]}), "not a number"),
    (completion(token_ids=[10, 11], finish_reason=3), "finish_reason"),
    (lambda: (200, b'{"choices": [{"index": 0, "token_ids": [10], "logprobs": '
                   b'{"token_logprobs": [NaN]}}]}'), "did not answer with JSON"),
    (lambda: (200, b"<html>proxy error</html>"), "did not answer with JSON"),
    (lambda: (200, b"[1, 2, 3]"), "not an object"),
    (lambda: (200, b'{"choices": []}'), "no completion"),
    (lambda: (200, b'{"choices": ["text"]}'), "not an object"),
    (lambda: (500, b'{"error": {"message": "engine died"}}'), "engine died"),
])
def test_a_bad_reply_is_an_error_at_the_hole_naming_the_server(
    server: tuple[str, Callable[[Reply], None]], model: Any, reply: Reply, message: str,
) -> None:
    url, answer = server
    answer(reply)
    with pytest.raises(qrun.GenerationError) as info:
        qrun.Query("Name:\n{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert message in info.value.message and url in info.value.message
    assert (info.value.span.line, info.value.span.column) == (2, 1)


def test_a_server_that_never_answers_times_out(
    server: tuple[str, Callable[[Reply], None]],
) -> None:
    url, answer = server
    model = qrun.load_model("smollm2", backend="vllm", url=url, timeout=0.5)

    def slow() -> tuple[int, bytes]:
        time.sleep(20)
        return completion(token_ids=[10])()

    answer(slow)
    query = qrun.Query("Name: {{ gen n max_tokens=4 heal=false }}")
    model.encode("Name:")  # the tokenizer's first use is not the server's time
    started = time.perf_counter()
    with pytest.raises(qrun.GenerationError, match="did not answer within 0.5 s"):
        query.run(model=model)
    # Far less than the server's 20 s, with room for a loaded machine.
    assert time.perf_counter() - started < 8


def test_a_good_reply_is_replayed(server: tuple[str, Callable[[Reply], None]],
                                  model: Any) -> None:
    url, answer = server
    ids = model.encode(" Alice")
    answer(completion(token_ids=ids, logprobs={"token_logprobs": [-0.5] * len(ids)},
                      finish_reason="stop"))
    r = qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert r["n"] == " Alice" and r.holes["n"].logprobs == [-0.5] * len(ids)


def test_a_bad_timeout_is_a_usage_error() -> None:
    for bad in (0, -1, float("nan")):
        with pytest.raises(qrun.UsageError, match="timeout"):
            qrun.load_model("smollm2", backend="vllm", url="http://127.0.0.1:9", timeout=bad)
