"""qrun serve under hostile load (issue #38), on loopback against a real uvicorn with the
bounded connections `qrun serve` runs on (qrun/serve/connections.py): connections that send
their headers slowly are closed after the header timeout while legitimate requests beside them
are all answered; a flood beyond the connection bound is refused at accept, so descriptors stay
bounded; an oversized header and a dripped body are cut; and after it all no queue place or
run slot is left taken. Every wait is for an event, with a generous bound (tests/hang.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.serve import app
from qrun.serve.service import Service
from tests.hang import alarm, wait_until
from tests.serve.serving import serving

PERSON = '---\ntemperature: 0\n---\nName: {{ name }}.\nAge: {{ gen age regex="[0-9]{1,2}" }}\n'
HEADER_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 40


@pytest.fixture(scope="module")
def server(tiny: TransformersBackend) -> Iterator[tuple[str, Service]]:
    asgi = app({"person": qrun.Query(PERSON)}, model=tiny, max_running=2, max_queue=64,
               body_timeout_s=2)
    with serving(asgi, header_timeout=HEADER_TIMEOUT_S, max_connections=MAX_CONNECTIONS) as url:
        yield url, asgi.state.qrun


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def half_request(url: str) -> socket.socket:
    """A connection that sends the start of a request's headers, and no more."""
    client = socket.create_connection(address(url))
    client.sendall(b"POST /v1/templates/person/run HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return client


def closed_by_server(client: socket.socket) -> bool:
    """The server has closed `client` (EOF or a reset); waits for it (a blocking read)."""
    client.settimeout(60)
    try:
        while client.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_headers_are_cut_and_legitimate_requests_beside_them_are_answered(
        server: tuple[str, Service]) -> None:
    url, service = server
    with alarm(240):
        slow = [half_request(url) for _ in range(30)]  # under the bound of 40
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(
                lambda i: httpx.post(f"{url}/v1/templates/person/run", timeout=120,
                                     json={"inputs": {"name": f"Ada {i}"}}), range(16)))
        assert [a.status_code for a in answers] == [200] * 16  # none dropped
        # Each slow connection is closed by the server (its header deadline), none answered.
        assert all(closed_by_server(client) for client in slow)
        for client in slow:
            client.close()
        wait_until(lambda: service.runs.idle)
    assert service.runs.queued == 0 and service.runs.active == 0
    metrics = httpx.get(f"{url}/metrics").text
    assert "qrun_queue_depth 0.0" in metrics and "qrun_running_runs 0.0" in metrics


def test_a_flood_beyond_the_connection_bound_is_refused_at_accept(
        tiny: TransformersBackend) -> None:
    """With the header deadline out of the way (600 s), the bound alone: of 30 connections
    the server keeps 10 open and closes the rest as it accepts them (issue #38: 1,200 slow
    connections took every descriptor of the process)."""
    asgi = app({"person": qrun.Query(PERSON)}, model=tiny)
    with alarm(240), serving(asgi, header_timeout=600, max_connections=10) as url:
        flood = [half_request(url) for _ in range(30)]
        assert all(closed_by_server(client) for client in flood[10:])
        for client in flood[:10]:  # still open: no data, no EOF
            client.setblocking(False)
            with pytest.raises(BlockingIOError):
                client.recv(1)
            client.close()
        for client in flood[10:]:
            client.close()
        # Their places are free again: a request is answered.
        wait_until(lambda: _answers(url))


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=60).status_code == 200
    except httpx.TransportError:
        return False


def test_an_oversized_header_is_refused_without_being_read_whole(
        server: tuple[str, Service]) -> None:
    url, _ = server
    with alarm(120):
        client = socket.create_connection(address(url))
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        try:
            for _ in range(2048):  # up to 128 MiB; the server stops reading long before
                client.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            client.settimeout(60)
            answer = client.recv(4096)
        except (ConnectionResetError, TimeoutError):
            pass
        client.close()
        assert sent < 64 << 20
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4")
        assert httpx.get(f"{url}/healthz", timeout=60).status_code == 200


def test_a_dripped_body_is_cut_408(server: tuple[str, Service]) -> None:
    url, _ = server
    with alarm(120):
        client = socket.create_connection(address(url))
        client.sendall(b"POST /v1/templates/person/run HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        client.settimeout(60)
        answer = b""
        while b"\r\n\r\n" not in answer or b"}" not in answer.split(b"\r\n\r\n", 1)[1]:
            chunk = client.recv(4096)
            if not chunk:
                break
            answer += chunk
        client.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"body_timeout"' in body


def test_a_body_cut_short_is_no_server_error(server: tuple[str, Service],
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Issue #38: a connection closed while its body was still arriving (the client gone, or
    SIGTERM's shutdown) was answered 500 with a traceback in the log."""
    url, _ = server
    with alarm(120), caplog.at_level("INFO", logger="qrun.serve"):
        client = socket.create_connection(address(url))
        client.sendall(b"POST /v1/templates/person/run HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        client.close()
        wait_until(lambda: 'qrun_requests_total{status="499"}' in
                   httpx.get(f"{url}/metrics").text)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
    assert any("client_closed" in r.getMessage() for r in caplog.records)
