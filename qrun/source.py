"""Source text and positions: every user-facing error points back into a Source through a Span."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Source:
    """A template's text and the name it is reported under (a file path or "<string>")."""

    name: str
    text: str

    def line_text(self, line: int) -> str:
        """The text of 1-based line `line` without its newline ('' past the end)."""
        lines = self.text.splitlines()
        if 1 <= line <= len(lines):
            return lines[line - 1]
        return ""

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
        """1-based (line, column) of a character offset."""
        line = self.text.count("\n", 0, offset) + 1
        line_start = self.text.rfind("\n", 0, offset) + 1
        return line, offset - line_start + 1


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


def excerpt(source: Source, span: Span) -> str:
    """The span's first source line with a caret under its start (and tildes under the rest)."""
    text = source.line_text(span.line)
    width = 1
    if span.end_line == span.line and span.end_column > span.column:
        width = span.end_column - span.column
    # Tabs keep their width in the caret line so the caret stays under the right character.
    pad = "".join("\t" if ch == "\t" else " " for ch in text[: span.column - 1])
    return f"  {text}\n  {pad}^{'~' * (width - 1)}"
