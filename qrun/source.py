"""Source text and positions: every user-facing error points back into a Source through a Span."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

_NEWLINE = re.compile("\n")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Source:
    """A template's text and the name it is reported under (a file path or "<string>").

    Lines are separated by "\n" only (a "\r" before it belongs to the newline); "\x0c",
    "\u2028" and friends are ordinary characters. compile_source normalizes every newline
    ("\r\n", a lone "\r") to "\n" before a Source is made (lang/text.py), so positions agree
    with the editor's line numbers for LF, CRLF and CR files. Offsets are str indices
    (characters, not bytes) into that normalized text."""

    name: str
    text: str
    # Offsets of the line starts, computed on first use (frozen, so set with object.__setattr__).
    _line_starts: tuple[int, ...] | None = field(
        default=None, init=False, repr=False, compare=False)

    def line_text(self, line: int) -> str:
        """The text of 1-based line `line` without its newline ('' past the end)."""
        starts = self.line_starts()
        if not 1 <= line <= len(starts):
            return ""
        end = starts[line] - 1 if line < len(starts) else len(self.text)
        text = self.text[starts[line - 1]:end]
        return text[:-1] if text.endswith("\r") and end < len(self.text) else text

    def span_at(self, offset: int, length: int = 0) -> Span:
        """The span of `length` characters starting at character offset `offset`."""
        offset = max(0, min(offset, len(self.text)))
        end = max(offset, min(offset + length, len(self.text)))
        line, column = self.position(offset)
        end_line, end_column = self.position(end)
        return Span(offset, end, line, column, end_line, end_column)

    def end_span(self) -> Span:
        """A zero-width span at the end of the text (where an unexpected EOF is reported)."""
        return self.span_at(len(self.text))

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset, in O(log lines)."""
        starts = self.line_starts()
        line = max(1, bisect.bisect_right(starts, offset))
        return line, offset - starts[line - 1] + 1

    def line_starts(self) -> tuple[int, ...]:
        """The offset at which each line starts (line 1 at index 0), computed once."""
        starts = self._line_starts
        if starts is None:
            starts = (0, *(match.end() for match in _NEWLINE.finditer(self.text)))
            object.__setattr__(self, "_line_starts", starts)
        return starts


@dataclass(frozen=True, slots=True)
class Span:
    """Character offsets [start, end) and 1-based line/column of both ends."""

    start: int
    end: int
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


EXCERPT_WIDTH = 120
"""Characters of a source line an excerpt shows at most: a longer line (a template written on
one line, generated text) is cut to a window around the span, marked with '…' at each cut."""
EXCERPT_BEFORE = 40
"""Characters a cut line keeps before the span's start."""


def excerpt(source: Source, span: Span) -> str:
    """The span's first source line with a caret under its start (and tildes under the rest),
    cut to EXCERPT_WIDTH characters around the span where the line is longer."""
    text = printable(source.line_text(span.line))
    width = 1
    if span.end_line == span.line and span.end_column > span.column:
        width = span.end_column - span.column
    start = span.column - 1
    if len(text) > EXCERPT_WIDTH:
        first = max(0, min(start - EXCERPT_BEFORE, len(text) - EXCERPT_WIDTH))
        last = first + EXCERPT_WIDTH
        head, tail = ("…" if first else ""), ("…" if last < len(text) else "")
        width = max(1, min(width, last - start))
        text = head + text[first:last] + tail
        start = start - first + len(head)
    # Tabs keep their width in the caret line so the caret stays under the right character.
    pad = "".join("\t" if ch == "\t" else " " for ch in text[:start])
    return f"  {text}\n  {pad}^{'~' * (width - 1)}"


def printable(text: str) -> str:
    """`text` with each lone surrogate (reported by lang/text.py; also in file names decoded
    with surrogateescape) as U+FFFD, which keeps the width: a surrogate cannot be printed."""
    return _SURROGATE.sub("\ufffd", text)
