"""`qrun FILE.tmpl --server URL` (qrun/cli/remote.py) against a real uvicorn on a free port:
the output and exit codes of a local run."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.cli import main, remote
from qrun.serve import app
from tests.hang import alarm
from tests.serve.serving import serving

PERSON = ('Name: {{ name }}.\nAge: {{ gen age regex="[0-9]{1,2}" }}'
          '\nCity: {{ gen city regex="[A-Z][a-z]{2,7}" }}\n')


@pytest.fixture(scope="module")
def url(tiny: TransformersBackend) -> Iterator[str]:
    with serving(app({"person": qrun.Query(PERSON)}, model=tiny)) as address:
        yield address


@pytest.fixture
def template(tmp_path: Path) -> str:
    path = tmp_path / "person.tmpl"
    path.write_text(PERSON)
    return str(path)


def test_json_and_streamed_output_are_a_local_runs(
        url: str, template: str, tiny: TransformersBackend,
        capsys: pytest.CaptureFixture[str]) -> None:
    local = qrun.Query(PERSON).run({"name": "Ada"}, model=tiny, seed=3)
    assert main([template, "--server", url, "-v", "name=Ada", "--seed", "3", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert set(row) == {"text", "vars", "stats"}
    assert (row["text"], row["vars"]) == (local.text, local.vars)
    assert main([template, "--server", url, "-v", "name=Ada", "--seed", "3", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out == local.text
    assert json.loads(err)["generated_tokens"] == local.stats.generated_tokens


def test_errors_exit_as_a_local_run_does(url: str, template: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([template, "--server", url]) == 2
    assert "missing input 'name'" in capsys.readouterr().err
    other = tmp_path / "nobody.tmpl"
    assert main([str(other), "--server", url, "--json"]) == 2
    assert "no template named 'nobody'" in capsys.readouterr().err
    assert main([template, "--server", url, "--model", "x"]) == 2
    assert "--model cannot go with it" in capsys.readouterr().err
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    assert main([template, "--server", closed, "-v", "name=x"]) == 2
    assert "cannot reach the server" in capsys.readouterr().err


def test_inputs_lines_run_on_the_server_in_order(
        url: str, template: str, tmp_path: Path, tiny: TransformersBackend,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = tmp_path / "people.jsonl"
    lines.write_text('{"id": "a", "name": "Ada"}\nnot json\n{"id": "c", "name": "Cy"}\n')
    code = main([template, "--server", url, "--inputs", str(lines), "--id", "id",
                 "--fields", "vars", "--seed", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1  # a line failed, as with a local --inputs
    assert [row["id"] for row in rows] == ["a", None, "c"]
    assert rows[1]["line"] == 2
    local = qrun.Query(PERSON).run_many([{"name": "Ada"}, {"name": "Cy"}], model=tiny, seed=2)
    assert [rows[0]["vars"], rows[2]["vars"]] == [
        r.vars for r in local if isinstance(r, qrun.Result)]


# --- a server that is not to be trusted (issue #38): a stand-in on 127.0.0.1 -----------------

class _Hostile(BaseHTTPRequestHandler):
    """Answers every POST with `reply` (status, headers, body chunks); records the headers."""

    reply: tuple[int, dict[str, str], list[bytes]] = (200, {}, [])
    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(dict(self.headers))
        status, headers, chunks = type(self).reply
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        for chunk in chunks:
            if chunk == b"<hang>":
                time.sleep(3)  # silent past the client's read timeout (set to 1 s below)
                continue
            self.wfile.write(chunk)
            self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, type[_Hostile]]]:
    handler = type("Handler", (_Hostile,), {"seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("QRUN_API_KEY", "s3cret")
    monkeypatch.setattr(remote, "STREAM_READ_TIMEOUT_S", 1.0)
    monkeypatch.setattr(remote, "BATCH_READ_TIMEOUT_S", 1.0)
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


SSE = {"Content-Type": "text/event-stream"}
TEXT = b'event: text\ndata: {"text": "Name: Ada."}\n\n'
DONE = b'event: done\ndata: {"text": "Name: Ada.", "vars": {}, "stats": {}}\n\n'


@pytest.mark.parametrize("reply, message", [
    ((200, SSE, [TEXT]), "a stream that ended before the run did"),  # killed mid-stream
    ((200, SSE, [TEXT, b"<hang>", DONE]), "the server went silent"),
    ((200, SSE, [b"event: done\ndata: {not json}\n\n"]), "an event that is not JSON"),
    ((200, SSE, [b'event: done\ndata: {"text": "x"}\n\n']), "a result without its fields"),
    ((200, SSE, [b'event: text\ndata: {"text": 3}\n\n']), "a text event without text"),
    ((200, SSE, [b'event: error\ndata: ["no"]\n\n']), "an error event that is not one"),
    ((502, {}, [b"<html>bad gateway</html>"]), "HTTP 502"),
    ((500, {"Content-Type": "application/json"}, [b'{"detail": 1}']), "an error that is not"),
    ((302, {"Location": "http://elsewhere.invalid/steal"}, []),
     "a redirect to http://elsewhere.invalid/steal; not followed"),
])
def test_a_run_on_a_server_that_answers_badly_is_an_error(
        hostile: tuple[str, type[_Hostile]], template: str, reply: Any, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, handler = hostile
    handler.reply = reply
    with alarm(60):
        code = main([template, "--server", url, "-v", "name=Ada"])
    out, err = capsys.readouterr()
    assert code in (1, 2) and message in err, err
    assert "internal error" not in err
    assert len(handler.seen) == 1  # a redirect is not followed: the key went nowhere else


@pytest.mark.parametrize("reply, message", [
    ((200, {}, [b'{"text": "a"}\n']), "1 lines for 2 inputs"),
    ((200, {}, [b'{"text": "a"}\n', b"<hang>", b'{"text": "b"}\n']), "went silent"),
    ((200, {}, [b'{"text": "a"}\n', b"[1, 2]\n"]), "a line that is not an object"),
    ((200, {}, [b"garbage\n", b"{}\n"]), "a line that is not JSON"),
])
def test_a_batch_on_a_server_that_answers_badly_is_an_error(
        hostile: tuple[str, type[_Hostile]], template: str, tmp_path: Path, reply: Any,
        message: str, capsys: pytest.CaptureFixture[str]) -> None:
    url, handler = hostile
    handler.reply = reply
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"name": "Ada"}\n\n{"name": "Cy"}\n')
    with alarm(60):
        code = main([template, "--server", url, "--inputs", str(lines)])
    assert code == 1 and message in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["localhost:8000", "ftp://127.0.0.1", "http://", "http://:80",
                                 "http://127.0.0.1:port", "http://127.0.0.1:99999",
                                 "http://[::1", "http://exa mple.com", "//127.0.0.1:8000",
                                 "http://127.0.0.1:8000\n"])
def test_a_server_url_that_is_not_one_is_a_usage_error(
        bad: str, template: str, capsys: pytest.CaptureFixture[str]) -> None:
    with alarm(60):
        assert main([template, "--server", bad, "-v", "name=Ada"]) == 2
    err = capsys.readouterr().err
    assert "--server" in err and "internal error" not in err
