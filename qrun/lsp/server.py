"""`qrun lsp`: the language server over stdio (pygls), wiring the protocol to the analysis
functions of qrun/lsp (diagnostics, hover, completion, definition, symbols), which take text
and give plain data; here positions are converted to the client's units and the data to
lsprotocol types.

Each document is compiled on open and after every change: changes that come within
DEBOUNCE_S of each other are compiled once, on one worker thread (the compiler is not run
twice at once, and a compile never blocks the protocol's event loop); a compile that finishes
after its document changed again is dropped, not published. Hover and definition answer from
the analysis of the current text (waiting for its compile when one is pending); completion
answers at once, from the text and the last analysis that parsed. Any exception inside a
handler is caught and logged to the client: no document can stop the server."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO, TypeVar
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.io_ import StdinAsyncReader, StdoutWriter, run_async
from pygls.lsp.server import LanguageServer

from qrun.collector import collector_paused
from qrun.lang.names import Signatures
from qrun.lsp import completion as completing
from qrun.lsp import definition as defining
from qrun.lsp import diagnostics as diagnosing
from qrun.lsp import hover as hovering
from qrun.lsp import symbols as outlining
from qrun.lsp.analysis import Analysis, Range, analyze
from qrun.lsp.transport import AnsweringProtocol, ResyncingReader

DEBOUNCE_S = 0.02
"""Changes this close together are compiled once (a burst of keystrokes); short, since a
compile of a dense 1,000-line template takes ~0.13 s of the 0.2 s a diagnostic may take."""
VERSION = "0.1.0"

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Document:
    """What the server holds for one open document: the latest analysis, the last one whose
    text parsed (completion's names while the text is half typed), the compile in flight."""

    latest: Analysis | None = None
    latest_text: str | None = None
    parsed: Analysis | None = None
    pending: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


class QrunLanguageServer(LanguageServer):
    """The server, with its documents' analyses and the one thread compiles run on."""

    def __init__(self, functions: Signatures | None = None) -> None:
        super().__init__("qrun", VERSION, protocol_cls=AnsweringProtocol)
        # The host functions templates may call (`qrun lsp --functions FILE.py`), as `qrun
        # --check --functions` takes them: the same front end, so the same verdict.
        self.functions = functions
        self.documents: dict[str, _Document] = {}
        self.compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qrun-compile")

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """pygls's stdio server (LanguageServer._start_io_async), reading through a
        ResyncingReader (qrun/lsp/transport.py): a malformed message is dropped, not the
        end of the conversation."""
        self._stop_event = threading.Event()
        reader = ResyncingReader(StdinAsyncReader(stdin or sys.stdin.buffer, self.thread_pool))
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        try:
            asyncio.run(run_async(stop_event=self._stop_event, reader=reader,
                                  protocol=self.protocol, logger=log,
                                  error_handler=self.report_server_error))
        except BrokenPipeError:
            log.error("qrun lsp: the client went away")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()  # type: ignore[no-untyped-call]

    def text(self, uri: str) -> str:
        """The document's text: as the client sent it, or (a document it never opened) read
        from disk by pygls; one that cannot be read is empty, so a request about it gets an
        empty answer, not an internal error with a traceback."""
        try:
            return self.workspace.get_text_document(uri).source
        except (OSError, UnicodeDecodeError, ValueError):
            return ""

    def schedule(self, uri: str, delay: float) -> None:
        """Compile the document (after `delay`, dropping a compile not yet started)."""
        state = self.documents.setdefault(uri, _Document())
        if state.pending is not None and not state.pending.done():
            state.pending.cancel()
        state.done.clear()
        state.pending = asyncio.get_running_loop().create_task(self.compile(uri, delay))

    async def compile(self, uri: str, delay: float) -> None:
        state = self.documents[uri]
        if delay:
            await asyncio.sleep(delay)
        try:
            text = self.text(uri)
            loop = asyncio.get_running_loop()
            analysis = await loop.run_in_executor(self.compiler, _analyze, text, path_of(uri),
                                                  self.functions)
            if self.documents.get(uri) is not state or self.text(uri) != text:
                return  # changed or closed meanwhile: its own compile is coming
            state.latest, state.latest_text = analysis, text
            if analysis.template is not None:
                state.parsed = analysis
            state.done.set()
            self.publish(uri, analysis, text)
        except Exception:  # a bug: logged, and no request waits for this compile forever
            log.exception("qrun lsp: internal error compiling %s", uri)
            state.done.set()

    def publish(self, uri: str, analysis: Analysis, text: str) -> None:
        found: list[diagnosing.Diagnostic] = _guard(
            lambda: diagnosing.diagnostics_of(analysis), [])
        lines = _lines(text)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=uri, diagnostics=[self.diagnostic(lines, d) for d in found]))

    async def current(self, uri: str) -> Analysis:
        """The analysis of the document's current text (waiting for its compile)."""
        state = self.documents.setdefault(uri, _Document())
        text = self.text(uri)
        if state.latest is not None and state.latest_text == text:
            return state.latest
        if state.pending is None or state.pending.done():
            self.schedule(uri, 0)
        await state.done.wait()
        return (state.latest if state.latest is not None
                else _analyze(text, path_of(uri), self.functions))

    async def at(self, params: types.HoverParams | types.DefinitionParams
                 ) -> tuple[Analysis, str, int, int]:
        """What a request about a position needs: the document's current analysis, its text,
        and the position as a line and a code point."""
        uri = params.text_document.uri
        analysis = await self.current(uri)
        text = self.text(uri)
        line, character = self.position(text, params.position)
        return analysis, text, line, character

    # ---- positions: qrun's code points <-> the client's units --------------------------------

    def units(self, line_text: str, characters: int) -> int:
        """Code points -> the negotiated encoding's units (UTF-16 unless agreed otherwise)."""
        encoding = self.workspace.position_encoding
        head = line_text[:characters]
        if encoding == types.PositionEncodingKind.Utf32:
            return len(head)
        if encoding == types.PositionEncodingKind.Utf8:
            return len(head.encode("utf-8", "surrogatepass"))
        return len(head.encode("utf-16-le", "surrogatepass")) // 2

    def characters(self, line_text: str, units: int) -> int:
        """The client's units -> code points (the inverse of units())."""
        count = 0
        for index in range(len(line_text) + 1):
            if count >= units or index == len(line_text):
                return index
            count += self.units(line_text[index], 1)
        return len(line_text)

    def range(self, lines: list[str] | None, where: Range) -> types.Range:
        """`where` in the client's units, given the document's lines (_lines); in a document
        whose text the server does not hold (None: an included file) characters are taken
        for units."""

        def position(line: int, character: int) -> types.Position:
            if lines is None:
                return types.Position(line, character)
            line_text = lines[line] if 0 <= line < len(lines) else ""
            return types.Position(line, self.units(line_text, character))

        return types.Range(position(where.line, where.character),
                           position(where.end_line, where.end_character))

    def position(self, text: str, position: types.Position) -> tuple[int, int]:
        lines = _lines(text, position.line + 1)
        line_text = lines[position.line] if 0 <= position.line < len(lines) else ""
        return position.line, self.characters(line_text, position.character)

    def diagnostic(self, lines: list[str], found: diagnosing.Diagnostic) -> types.Diagnostic:
        severity = (types.DiagnosticSeverity.Error if found.severity == diagnosing.ERROR
                    else types.DiagnosticSeverity.Warning)
        related = [types.DiagnosticRelatedInformation(
            types.Location(_uri(other.path), self.range(None, other.range)), other.message)
            for other in found.related]
        return types.Diagnostic(self.range(lines, found.range), found.message, severity,
                                source="qrun", related_information=related or None)


def _lines(text: str, most: int = -1) -> list[str]:
    """The document's lines (the first `most`) as qrun and LSP count them: split at "\\n",
    "\\r\\n" and "\\r" (not at the other characters str.splitlines() takes for line ends)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n", most)


def _analyze(text: str, path: str, functions: Signatures | None = None) -> Analysis:
    """The analysis with the cycle collector paused (qrun/collector.py): a 1,000-line
    template's parse and compile make millions of objects and no cycle, and the collections
    they set off made the slowest of 30 compiles 166-195 ms against a median of 135-144
    (paused, with the heap frozen after the first: 127-133 against 123-128)."""
    with collector_paused():
        return analyze(text, path, functions)


WARM_UP = "---\ninputs:\n  topic: string\n---\n{{ topic }}: {{ gen n regex=INT }}\n"
"""Compiled once at start (serve): the parser's tables and the compiler's modules loaded
before the first document comes, then frozen with the rest of the server's heap."""


def warm_up() -> None:
    """A first compile, then what the server holds for good moved out of the cycle
    collector's reach (gc.freeze): a full collection then walks only what came after. Done
    before the client's first message, since the collection before the freeze takes ~40 ms
    (the first change after a document opened waited for it)."""
    _analyze(WARM_UP, "warm-up.tmpl")
    gc.collect()
    gc.freeze()


def _guard(compute: Callable[[], T], fallback: T) -> T:
    """`compute()`, or `fallback` (logged) if it fails: a bug in one feature must not stop the
    server."""
    try:
        return compute()
    except Exception:
        log.exception("qrun lsp: internal error")
        return fallback


def path_of(uri: str) -> str:
    """The file path of a `file:` URI; another URI (an unsaved buffer) as it is."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def _uri(path: str) -> str:
    from pathlib import Path

    try:
        return Path(path).absolute().as_uri()
    except ValueError:
        return path


def build_server(functions: Signatures | None = None) -> QrunLanguageServer:
    """The server with its features registered; `functions`: the host functions templates
    may call."""
    server = QrunLanguageServer(functions)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: QrunLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, 0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: QrunLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, DEBOUNCE_S)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: QrunLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        state = ls.documents.pop(params.text_document.uri, None)
        if state is not None and state.pending is not None:
            state.pending.cancel()
            state.done.set()  # a hover waiting for its compile answers from what there is
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=params.text_document.uri, diagnostics=[]))

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(ls: QrunLanguageServer, params: types.HoverParams) -> types.Hover | None:
        analysis, text, line, character = await ls.at(params)
        found = _guard(lambda: hovering.hover_at(analysis, line, character), None)
        if found is None:
            return None
        return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, found.markdown),
                           ls.range(_lines(text), found.range))

    kinds = {completing.INPUT: types.CompletionItemKind.Variable,
             completing.CAPTURE: types.CompletionItemKind.Field,
             completing.VARIABLE: types.CompletionItemKind.Variable,
             completing.PATTERN: types.CompletionItemKind.Constant,
             completing.FUNCTION: types.CompletionItemKind.Function,
             completing.ARGUMENT: types.CompletionItemKind.Property,
             completing.KEYWORD: types.CompletionItemKind.Keyword}

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=["{", "%", " ", "=", "|"]))
    def complete(ls: QrunLanguageServer, params: types.CompletionParams
                 ) -> types.CompletionList:
        uri = params.text_document.uri
        text = ls.text(uri)
        state = ls.documents.get(uri)
        known = (state.parsed if state is not None and state.parsed is not None
                 else _analyze("", path_of(uri)))
        line, character = ls.position(text, params.position)
        found: list[completing.Completion] = _guard(
            lambda: completing.complete_at(text, line, character, known), [])
        return types.CompletionList(False, [
            types.CompletionItem(item.label, kind=kinds[item.kind], detail=item.detail,
                                 insert_text=item.insert) for item in found])

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    async def definition(ls: QrunLanguageServer, params: types.DefinitionParams
                         ) -> types.Location | None:
        analysis, text, line, character = await ls.at(params)
        found = _guard(lambda: defining.definition_at(analysis, line, character), None)
        if found is None:
            return None
        here = found.path == analysis.source.name
        return types.Location(params.text_document.uri if here else _uri(found.path),
                              ls.range(_lines(text) if here else None, found.range))

    symbol_kinds = {outlining.INPUT: types.SymbolKind.Variable,
                    outlining.HOLE: types.SymbolKind.Field}

    @server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    async def document_symbols(ls: QrunLanguageServer, params: types.DocumentSymbolParams
                               ) -> list[types.DocumentSymbol]:
        uri = params.text_document.uri
        analysis = await ls.current(uri)
        text = ls.text(uri)
        found: list[outlining.Symbol] = _guard(lambda: outlining.symbols_of(analysis), [])
        lines = _lines(text)
        return [types.DocumentSymbol(s.name, symbol_kinds[s.kind], ls.range(lines, s.range),
                                     ls.range(lines, s.selection), detail=s.detail)
                for s in found]

    return server


def serve(functions: Signatures | None = None) -> int:
    """Run the server on stdin and stdout until the client ends it; `functions`: the host
    functions templates may call."""
    server = build_server(functions)
    # On the compile thread, beside the protocol's loop: `initialize` is answered at once
    # (issue #38: it waited 7-12 s for the warm-up on a loaded machine), and a document's
    # first compile queues behind the warm-up, as before.
    server.compiler.submit(warm_up)
    server.start_io()
    return 0
