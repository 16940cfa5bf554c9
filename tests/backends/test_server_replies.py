"""A vLLM server's replies are data, not trusted (backends/vllm_server.py): a server answering
with wrong types, token ids outside the vocabulary, non-numeric log-probabilities or no JSON at
all gives a GenerationError at the hole naming the server, and one that never answers times
out. The client keeps its connections, retries what may be retried and follows no redirect
(backends/server_http.py). The server here is a small HTTP stand-in on 127.0.0.1 (the real one:
tests/test_vllm.py)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import qrun

# A reply to one completion request (its JSON body): status, body and extra headers.
Reply = Callable[[dict[str, Any]], tuple[int, bytes] | tuple[int, bytes, dict[str, str]]]


class _Handler(BaseHTTPRequestHandler):
    reply: Reply
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn
    connections: set[int] = set()  # the client ports seen: one per kept connection
    completions = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._send(200, json.dumps({"data": [{"id": "m", "max_model_len": 8192}]}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).connections.add(self.client_address[1])
        if self.path == "/tokenize":
            self._send(404, b'{"error": "no such route"}')
        elif b"%llguidance {}" in body:  # connect's probe (vllm_server.py): a llguidance server
            self._send(200, json.dumps({"choices": [{"index": 0, "finish_reason": "length",
                                                     "token_ids": [64]}],
                                        "usage": {"prompt_tokens": 1,
                                                  "completion_tokens": 1}}).encode())
        else:
            type(self).completions += 1
            self._send(*type(self).reply(json.loads(body)))

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the timeout test's client hangs up before the slow answer is written


@dataclass
class StandIn:
    url: str
    handler: type[_Handler]

    def answer(self, reply: Reply) -> None:
        self.handler.reply = staticmethod(reply)  # type: ignore[assignment]
        self.handler.completions = 0


@pytest.fixture(scope="module")
def server() -> Iterator[StandIn]:
    handler = type("Handler", (_Handler,), {"reply": staticmethod(lambda _: (200, b"{}")),
                                            "connections": set()})
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    try:
        yield StandIn(f"http://127.0.0.1:{httpd.server_address[1]}", handler)
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def model(server: StandIn) -> Iterator[Any]:
    backend = qrun.load_model("smollm2", backend="vllm", url=server.url, timeout=5)
    yield backend
    backend.close()


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def completion(usage: Any = None, **choice: Any) -> Reply:
    """A completion with `choice`'s fields and a usage block true to the request, with the
    fields of `usage` over it (or `usage` itself where it is not an object)."""
    def reply(request: dict[str, Any]) -> tuple[int, bytes]:
        ids = choice.get("token_ids")
        true = {"prompt_tokens": len(request["prompt"]),
                "completion_tokens": len(ids) if isinstance(ids, list) else 0}
        return 200, json.dumps({"choices": [{"index": 0, "finish_reason": "length", **choice}],
                                "usage": {**true, **usage} if isinstance(usage, dict)
                                else true if usage is None else usage}).encode()
    return reply


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
    (lambda _: (200, b'{"choices": [{"index": 0, "token_ids": [10], "logprobs": '
                     b'{"token_logprobs": [NaN]}}]}'), "did not answer with JSON"),
    (lambda _: (200, b"<html>proxy error</html>"), "did not answer with JSON"),
    (lambda _: (200, b"[1, 2, 3]"), "not an object"),
    (lambda _: (200, b'{"choices": []}'), "no completion"),
    (lambda _: (200, b'{"choices": ["text"]}'), "not an object"),
    (lambda _: (500, b'{"error": {"message": "engine died"}}'), "engine died"),
    # Counts are checked (issue #38: a non-numeric usage and more tokens than max_tokens were
    # taken silently).
    (completion(token_ids=[10], usage={"prompt_tokens": "3"}),
     "usage.prompt_tokens that is not a count"),
    (completion(token_ids=[10], usage={"completion_tokens": -1}),
     "usage.completion_tokens that is not a count"),
    (completion(token_ids=[10], usage="lots"), "a usage that is not an object"),
    (lambda _: (200, b'{"choices": [{"index": 0, "token_ids": [10]}]}'), "no usage block"),
    (completion(token_ids=[10], usage={"prompt_tokens": 999}),
     "usage.prompt_tokens 999 for a prompt of"),
    (completion(token_ids=[10], usage={"completion_tokens": 9}),
     "usage.completion_tokens 9 over max_tokens 4"),
    (completion(token_ids=[10, 11, 12, 13, 14, 15]), "6 tokens for max_tokens 4"),
    (completion(token_ids=[10], usage={"prompt_tokens_details": {"cached_tokens": 999}}),
     "999 cached tokens of a prompt of"),
])
def test_a_bad_reply_is_an_error_at_the_hole_naming_the_server(
    server: StandIn, model: Any, reply: Reply, message: str,
) -> None:
    url, answer = server.url, server.answer
    answer(reply)
    with pytest.raises(qrun.GenerationError) as info:
        qrun.Query("Name:\n{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert message in info.value.message and url in info.value.message
    assert (info.value.span.line, info.value.span.column) == (2, 1)


def test_a_server_that_never_answers_times_out(server: StandIn, stack: ExitStack) -> None:
    url, answer = server.url, server.answer
    model = qrun.load_model("smollm2", backend="vllm", url=url, timeout=0.5)
    released = threading.Event()
    stack.callback(model.close)

    def slow(request: dict[str, Any]) -> tuple[int, bytes]:
        released.wait(60)  # answers only once the client has given up (no clock compared)
        return completion(token_ids=[10])(request)

    answer(slow)
    try:
        with pytest.raises(qrun.GenerationError, match="did not answer within 0.5 s"):
            qrun.Query("Name: {{ gen n max_tokens=4 heal=false }}").run(model=model)
        assert not released.is_set()
    finally:
        released.set()
    # A read that timed out is not sent again: the server may still be working on it.
    assert server.handler.completions == 1


@pytest.mark.parametrize("status, headers", [(503, {}), (502, {}), (429, {"Retry-After": "0"}),
                                             (504, {})])
def test_a_server_that_says_not_now_is_asked_again(
    server: StandIn, model: Any, status: int,
    headers: dict[str, str],
) -> None:
    answer = server.answer
    ids = model.encode(" Bob")
    good = completion(token_ids=ids, finish_reason="stop")
    calls: list[int] = []

    def busy_once(request: dict[str, Any]) -> tuple[int, bytes] | tuple[int, bytes, dict[str, str]]:
        calls.append(1)
        if len(calls) == 1:
            return status, b'{"error": {"message": "busy"}}', headers
        return good(request)

    answer(busy_once)
    r = qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert r["n"] == " Bob" and len(calls) == 2


def test_retries_end_and_a_failure_is_not_retried(
    server: StandIn, model: Any,
) -> None:
    answer = server.answer
    answer(lambda _: (503, b'{"error": {"message": "still loading"}}', {"Retry-After": "0"}))
    with pytest.raises(qrun.GenerationError, match="answered 503: still loading"):
        qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert server.handler.completions == 3  # the first try and two retries
    answer(lambda _: (500, b'{"error": {"message": "engine died"}}'))
    with pytest.raises(qrun.GenerationError, match="engine died"):
        qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert server.handler.completions == 1


def test_a_redirect_is_not_followed(server: StandIn,
                                    model: Any) -> None:
    """A 302 would carry the request to another host: an error naming where it pointed."""
    answer = server.answer
    answer(lambda _: (302, b"", {"Location": "http://elsewhere.invalid/v1/completions"}))
    with pytest.raises(qrun.GenerationError,
                       match="answered 302: a redirect to http://elsewhere.invalid"):
        qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert server.handler.completions == 1


def test_connections_are_kept(server: StandIn, model: Any) -> None:
    """Twelve holes, one after another, over one kept connection (not one each)."""
    answer = server.answer
    answer(completion(token_ids=model.encode(" x"), finish_reason="stop"))
    before = set(server.handler.connections)
    holes = "".join(f"{{{{ gen v{i} max_tokens=2 heal=false }}}};" for i in range(12))
    qrun.Query("Values:" + holes).run(model=model)
    assert server.handler.completions == 12
    assert len(server.handler.connections - before) <= 1


def test_a_closed_port_is_a_load_error_after_retries() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(qrun.ModelLoadError, match=f"cannot reach the vLLM server at "
                                                  f"http://127.0.0.1:{port}/v1/models"):
        qrun.load_model("smollm2", backend="vllm", url=f"http://127.0.0.1:{port}")


def test_the_default_timeout_is_the_openai_sdks(
        server: StandIn) -> None:
    model = qrun.load_model("smollm2", backend="vllm", url=server.url)
    assert model.client.timeout == 600
    model.close()


def test_a_good_reply_is_replayed(server: StandIn,
                                  model: Any) -> None:
    answer = server.answer
    ids = model.encode(" Alice")
    answer(completion(token_ids=ids, logprobs={"token_logprobs": [-0.5] * len(ids)},
                      finish_reason="stop"))
    r = qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert r["n"] == " Alice" and r.holes["n"].logprobs == [-0.5] * len(ids)


def test_a_bad_timeout_is_a_usage_error() -> None:
    for bad in (0, -1, float("nan")):
        with pytest.raises(qrun.UsageError, match="timeout"):
            qrun.load_model("smollm2", backend="vllm", url="http://127.0.0.1:9", timeout=bad)


def test_penalties_and_logit_bias_go_to_the_server_by_vllms_names(
        server: StandIn, model: Any) -> None:
    sent: list[dict[str, Any]] = []
    ids = model.encode(" Bob")

    def reply(request: dict[str, Any]) -> tuple[int, bytes]:
        sent.append(request)
        return completion(token_ids=ids, logprobs={"token_logprobs": [-0.5] * len(ids)},
                          finish_reason="stop")(request)

    server.answer(reply)
    options = qrun.RunOptions(presence_penalty=0.5, repetition_penalty=1.1,
                              logit_bias={"7": -100}, min_p=0.05)
    qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model, options=options)
    qrun.Query("Name:{{ gen n max_tokens=4 heal=false }}").run(model=model)
    assert {key: sent[0].get(key) for key in (
        "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p")
    } == {"presence_penalty": 0.5, "frequency_penalty": None, "repetition_penalty": 1.1,
          "logit_bias": {"7": -100.0}, "min_p": 0.05}
    assert not {"presence_penalty", "logit_bias", "min_p"} & set(sent[1])
