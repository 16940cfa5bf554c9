"""`qrun FILE.tmpl --server URL` (docs/serve.md §1.3): the run goes to a running `qrun serve`
instead of a model loaded here; the output and exit codes are a local run's. The template is
named by its file name without `.tmpl`, as the server names it.

The server's answers are data, not trusted (issue #38): a run is always read as its event
stream, which must end with its `done` or `error` event (a server killed mid-stream is an
error, never partial text and exit 0), a batch must answer every line, anything malformed is
an error naming the server, a redirect is not followed (it would carry the API key
elsewhere), and a server that goes silent is given up on (the stream's pings come every
15 s; a batch line may take up to the read timeout)."""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx

from qrun.cli.output import write
from qrun.errors import QrunError, UsageError
from qrun.jsonio import dumps_line, finite, split_lines

# A server's error codes that are a usage error where a local run would exit 2.
USAGE_CODES = {"bad_request", "input_error", "input_too_large", "template_not_found",
               "unauthorized", "not_found", "body_too_large", "context_too_long",
               "unsupported_media_type", "bad_host"}
CONNECT_TIMEOUT_S = 10.0
STREAM_READ_TIMEOUT_S = 120.0  # the server's event stream pings every 15 s while a run goes
BATCH_READ_TIMEOUT_S = 600.0  # a batch line is sent when it is done: as long as a run takes


class RemoteError(QrunError):
    """What the server answered instead of a result: its message (its rendering with the
    template position where it has one); exit 2 for a usage error, else 1."""

    def __init__(self, message: str, usage: bool) -> None:
        super().__init__(message)
        self.exit_code = 2 if usage else 1


def run_remote(url: str, file: str, inputs: dict[str, Any], options: dict[str, Any],
               fields: tuple[str, ...], id_field: str | None, as_json: bool,
               stats: bool) -> int:
    """One run on the server: printed as `qrun --json` prints it, or streamed as text.

    Raises:
        RemoteError: the server answered an error, or an answer that is not one.
        UsageError: a URL that is not one, or a server that cannot be reached.
    """
    asked = list(fields) if not stats or "stats" in fields else [*fields, "stats"]
    body = {"inputs": inputs, "options": options, "fields": asked, "stream": True}
    row: dict[str, Any] | None = None
    with _client(url, STREAM_READ_TIMEOUT_S) as client:
        for kind, data in _events(client, url, file, body):
            if kind == "text" and not as_json:
                text = data.get("text") if isinstance(data, dict) else None
                if not isinstance(text, str):
                    raise _bad(url, "a text event without text")
                write(text)
            elif kind == "done":
                row = data
                break
            elif kind == "error":
                raise _error(data, url)
    if not isinstance(row, dict) or any(name not in row for name in asked):
        raise _bad(url, f"a result without its fields ({', '.join(asked)})")
    if as_json:
        shown = {name: row[name] for name in fields}
        if id_field is not None:
            shown = {"id": inputs.get(id_field), **shown}
        print(dumps_line(shown))
    elif not str(row.get("text", "")).endswith("\n"):
        write("\n")
    if stats:
        print(json.dumps(finite(row["stats"]), indent=2, allow_nan=False), file=sys.stderr)
    return 0


def run_remote_lines(url: str, file: str, data: bytes, options: dict[str, Any],
                     fields: tuple[str, ...], id_field: str | None) -> int:
    """`--inputs` on the server's batch endpoint: its JSON Lines printed as they come, one per
    input line (fewer is an error); exit 1 when a line failed."""
    query = {**{k: json.dumps(v) for k, v in options.items()}, "fields": ",".join(fields)}
    if id_field is not None:
        query["id"] = id_field
    expected = sum(1 for _ in split_lines(data))
    answered = 0
    failed = False
    with _client(url, BATCH_READ_TIMEOUT_S) as client, _stream(
            client, url, file, "batch?" + urlencode(query), data,
            "application/x-ndjson") as answer:
        for text in _lines(answer, url):
            try:
                row = json.loads(text)
            except ValueError:
                raise _bad(url, f"a line that is not JSON: {text[:80]!r}") from None
            if not isinstance(row, dict):
                raise _bad(url, f"a line that is not an object: {text[:80]!r}")
            failed |= "error" in row
            answered += 1
            print(text, flush=True)
    if answered != expected:
        raise _bad(url, f"{answered} lines for {expected} inputs (the stream ended early)")
    return 1 if failed else 0


def _client(url: str, read_timeout: float) -> httpx.Client:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise UsageError(f"--server {url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--server must be http://HOST:PORT or https://HOST, got {url!r}")
    headers = {"Accept": "text/event-stream, application/x-ndjson, application/json"}
    key = os.environ.get("QRUN_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(timeout=httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT_S),
                        headers=headers, follow_redirects=False, trust_env=False)


def _stream(client: httpx.Client, url: str, file: str, endpoint: str, body: bytes,
            kind: str) -> Any:
    name = Path(file).name.removesuffix(".tmpl")
    target = f"{url.rstrip('/')}/v1/templates/{quote(name, safe='')}/{endpoint}"
    return _Answer(client, target, url, body, kind)


class _Answer:
    """One streamed request: entered, it is a response whose status is 200, or an error."""

    def __init__(self, client: httpx.Client, target: str, url: str, body: bytes,
                 kind: str) -> None:
        self.context = client.stream("POST", target, content=body,
                                     headers={"Content-Type": kind})
        self.url = url

    def __enter__(self) -> httpx.Response:
        try:
            response = self.context.__enter__()
        except httpx.TimeoutException:
            raise RemoteError(f"--server {self.url}: no answer in time", False) from None
        except (httpx.TransportError, httpx.InvalidURL, OSError) as exc:
            raise UsageError(f"--server {self.url}: cannot reach the server "
                             f"({str(exc)[:200] or type(exc).__name__})") from None
        if response.status_code == 200:
            return response
        try:
            if 300 <= response.status_code < 400:
                where = response.headers.get("location", "?")
                raise RemoteError(f"--server {self.url}: answered {response.status_code}, a "
                                  f"redirect to {where[:200]}; not followed (it would carry "
                                  "the API key there): give the final URL", True)
            payload = response.read()[:1 << 20]
            try:
                answer = json.loads(payload)
            except ValueError:
                raise RemoteError(f"--server {self.url}: HTTP {response.status_code}",
                                  response.status_code < 500) from None
            raise _error(answer, self.url, response.status_code)
        finally:
            self.context.__exit__(None, None, None)

    def __exit__(self, *exc: Any) -> None:
        self.context.__exit__(*exc)


def _lines(response: httpx.Response, url: str) -> Iterator[str]:
    """The answer's non-blank lines."""
    return (line for line in _raw_lines(response, url) if line.strip())


def _events(client: httpx.Client, url: str, file: str,
            body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The (event, JSON data) pairs of the run's server-sent event stream, to its end."""
    with _stream(client, url, file, "run", json.dumps(body).encode(),
                 "application/json") as answer:
        kind, data = "message", list[str]()
        for line in itertools.chain(_raw_lines(answer, url), [""]):
            if not line:
                if data:
                    try:
                        yield kind, json.loads("\n".join(data))
                    except ValueError:
                        raise _bad(url, f"an event that is not JSON: {data[0][:80]!r}") \
                            from None
                kind, data = "message", list[str]()
            elif line.startswith("event:"):
                kind = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data.append(line.removeprefix("data:").removeprefix(" "))
    raise _bad(url, "a stream that ended before the run did (no done or error event)")


def _raw_lines(response: httpx.Response, url: str) -> Iterator[str]:
    try:
        yield from response.iter_lines()
    except httpx.TimeoutException:
        raise RemoteError(f"--server {url}: the server went silent", False) from None
    except (httpx.TransportError, UnicodeDecodeError) as exc:
        raise _bad(url, f"a broken stream ({str(exc)[:120] or type(exc).__name__})") from None


def _bad(url: str, what: str) -> RemoteError:
    return RemoteError(f"--server {url}: the server answered with {what}", False)


def _error(answer: Any, url: str, status: int | None = None) -> RemoteError:
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return _bad(url, f"an error that is not one (HTTP {status})" if status
                    else "an error event that is not one")
    position = error.get("position")
    position = position if isinstance(position, dict) else {}
    message = position.get("rendered") or error.get("message") or "the server failed"
    return RemoteError(str(message)[:10_000], error.get("code") in USAGE_CODES)

