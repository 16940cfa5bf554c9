"""`qrun FILE.tmpl --server URL` (docs/serve.md §1.3): the run goes to a running `qrun serve`
instead of a model loaded here; the output and exit codes are a local run's. The template is
named by its file name without `.tmpl`, as the server names it; the standard library's HTTP
client is enough (one request, read as it arrives)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from qrun.cli.output import write
from qrun.errors import QrunError, UsageError
from qrun.jsonio import dumps_line, finite

# A server's error codes that are a usage error where a local run would exit 2.
USAGE_CODES = {"bad_request", "input_error", "template_not_found", "unauthorized",
               "not_found", "body_too_large"}
TIMEOUT_S = 3600.0  # a long run is the server's to bound (options.timeout), not the socket's


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
        RemoteError: the server answered an error.
        UsageError: the server cannot be reached.
    """
    body: dict[str, Any] = {"inputs": inputs, "options": options, "fields": list(fields)}
    if stats and "stats" not in fields:
        body["fields"] = [*fields, "stats"]
    row: dict[str, Any] = {}
    if as_json:
        row = json.loads(_post(url, file, "run", json.dumps(body).encode(), "application/json"))
        shown = {name: row[name] for name in fields}
        if id_field is not None:
            shown = {"id": inputs.get(id_field), **shown}
        print(dumps_line(shown))
    else:
        body["stream"] = True
        for kind, data in _events(_open(url, file, "run", json.dumps(body).encode(),
                                        "application/json")):
            if kind == "text":
                write(data["text"])
            elif kind == "done":
                row = data
            elif kind == "error":
                raise _error(data)
        if not str(row.get("text", "")).endswith("\n"):
            write("\n")
    if stats:
        print(json.dumps(finite(row["stats"]), indent=2, allow_nan=False), file=sys.stderr)
    return 0


def run_remote_lines(url: str, file: str, data: bytes, options: dict[str, Any],
                     fields: tuple[str, ...], id_field: str | None) -> int:
    """`--inputs` on the server's batch endpoint: its JSON Lines printed as they come; exit 1
    when a line failed."""
    query = {**{k: json.dumps(v) for k, v in options.items()}, "fields": ",".join(fields)}
    if id_field is not None:
        query["id"] = id_field
    failed = False
    with _open(url, file, "batch?" + urlencode(query), data, "application/x-ndjson") as answer:
        for line in answer:
            text = line.decode("utf-8").rstrip("\n")
            failed |= "error" in json.loads(text)
            print(text, flush=True)
    return 1 if failed else 0


def _open(url: str, file: str, endpoint: str, body: bytes, kind: str) -> Any:
    name = Path(file).name.removesuffix(".tmpl")
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/templates/{quote(name, safe='')}/{endpoint}", data=body,
        method="POST", headers={"Content-Type": kind})
    key = os.environ.get("QRUN_API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read())
        except ValueError:
            raise RemoteError(f"--server {url}: HTTP {exc.code}", exc.code < 500) from None
        raise _error(answer) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"--server {url}: cannot reach the server ({reason})") from None


def _post(url: str, file: str, endpoint: str, body: bytes, kind: str) -> bytes:
    with _open(url, file, endpoint, body, kind) as answer:
        data: bytes = answer.read()
        return data


def _events(answer: Any) -> Iterator[tuple[str, Any]]:
    """The (event, JSON data) pairs of a server-sent event stream."""
    with answer:
        kind, data = "message", list[str]()
        for raw in answer:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line:
                if data:
                    yield kind, json.loads("\n".join(data))
                kind, data = "message", list[str]()
            elif line.startswith("event:"):
                kind = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data.append(line.removeprefix("data:").removeprefix(" "))


def _error(answer: Any) -> RemoteError:
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    position = error.get("position") or {}
    message = position.get("rendered") or error.get("message") or "the server failed"
    return RemoteError(str(message), error.get("code") in USAGE_CODES)
