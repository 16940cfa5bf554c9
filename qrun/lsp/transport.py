"""The language server's JSON-RPC transport, hardened where pygls gives up (issue #38):

- A message whose `Content-Length` is not a number: pygls's reader (pygls/io_.py run_async)
  then reads the body as a header line, which runs into the next message's headers, and never
  frames a message again: the server stops answering. `ResyncingReader` drops such a message
  (logged) and finds the next `Content-Length:` header, so the messages after it are served.
- A request whose params do not fit its method: pygls logs "Unable to deserialize message"
  and sends nothing, so the editor waits forever. `AnsweringProtocol` answers it with the
  JSON-RPC error InvalidParams (-32602) before pygls drops it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger(__name__)

_CONTENT_LENGTH = re.compile(rb"Content-Length: (\d+)\r\n")
_HEADER = re.compile(rb"[A-Za-z][A-Za-z0-9-]*:[^\r\n]*\r\n|\r\n")


class ResyncingReader:
    """pygls's async reader, its header lines checked: a `Content-Length` that is no number,
    or a line that is no header, drops the message it belongs to and skips to the next
    `Content-Length:` header (found inside the line too: a body without a newline runs into
    the next message's first header line)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.skipping = False

    async def readline(self) -> bytes:
        while True:
            line: bytes = await self.reader.readline()
            if not line:
                return line
            found = line.find(b"Content-Length:")
            if found > 0 or (found == 0 and not _CONTENT_LENGTH.fullmatch(line)):
                if found > 0:  # a dropped body ran into the next message's header
                    line = line[found:]
                if not _CONTENT_LENGTH.fullmatch(line):
                    self._drop(f"a Content-Length that is not a number: {line[:60]!r}")
                    continue
                self.skipping = False
                return line
            if found == 0:
                self.skipping = False
                return line
            if self.skipping:
                continue
            if not _HEADER.fullmatch(line):
                self._drop(f"a line that is not a header: {line[:60]!r}")
                continue
            return line

    async def readexactly(self, n: int) -> bytes:
        data: bytes = await self.reader.readexactly(n)
        return data

    def _drop(self, why: str) -> None:
        if not self.skipping:
            log.warning("qrun lsp: dropped a message with %s", why)
        self.skipping = True


class AnsweringProtocol(LanguageServerProtocol):
    """pygls's protocol, answering a request whose params it cannot read (InvalidParams)
    instead of dropping it unanswered."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException:
            if "id" in data and "method" in data:
                error = JsonRpcInvalidParams(
                    f"invalid params for {str(data['method'])[:80]}").to_response_error()
                # pygls's own way to answer (JsonRPCProtocol._send_response); it has no
                # public one for a request it could not read.
                self._send_response(data["id"], error=error)
            raise
