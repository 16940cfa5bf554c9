"""Diagnostics: what `qrun --check FILE` reports for a document, as data. Each error and
warning keeps the compiler's message, position and notes (errors.py PositionedError, rendered
by --check as `FILE:LINE:COL: error: MESSAGE`, the caret line, then `note: ...` lines); an
error inside an included or called file is shown at the tag of this document that brings it
in, with the file's own position in the message and as related information."""

from __future__ import annotations

import re
from dataclasses import dataclass

from qrun.errors import PositionedError, QrunError, TemplateWarning
from qrun.lang.names import Signatures
from qrun.lsp.analysis import Analysis, Range, analyze

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True, slots=True)
class Related:
    """Another place a diagnostic is about: a file, a range in it, and what it is."""

    path: str
    range: Range
    message: str


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One error or warning: where in the document, the message with its notes (one per
    line, `note: ...`, as --check prints them), and `severity` (ERROR or WARNING)."""

    range: Range
    message: str
    severity: str
    related: tuple[Related, ...] = ()


def diagnostics(text: str, path: str, functions: Signatures | None = None) -> list[Diagnostic]:
    """Every error and warning `qrun --check path` would report for `text` (with the host
    `functions` of its `--functions` files)."""
    return diagnostics_of(analyze(text, path, functions))


def diagnostics_of(analysis: Analysis) -> list[Diagnostic]:
    """The diagnostics of a document already analyzed."""
    found = [_error(error, analysis) for error in analysis.errors]
    found.extend(_warning(warning, analysis) for warning in analysis.warnings)
    return found


def _message(message: str, notes: tuple[str, ...]) -> str:
    return "\n".join([message, *(f"note: {note}" for note in notes)])


def _error(error: QrunError, analysis: Analysis) -> Diagnostic:
    if not isinstance(error, PositionedError):
        return Diagnostic(Range(0, 0, 0, 0), str(error), ERROR)
    message = _message(error.message, error.notes)
    if error.source is analysis.source or error.source.name == analysis.source.name:
        return Diagnostic(Range.of(error.span), message, ERROR)
    # In another file: at this document's tag that includes (or calls) it, named in a note
    # the compiler adds (lang/compiler.py note_included: "included from PATH:LINE:COL").
    where = Range(0, 0, 0, 0)
    tag = re.compile(rf"(?:included|called) from {re.escape(analysis.source.name)}"
                     r":(\d+):(\d+)$")
    for note in error.notes:
        match = tag.search(note)
        if match:
            line, column = int(match[1]) - 1, int(match[2]) - 1
            where = Range(line, column, line, column)
    other = Related(error.source.name, Range.of(error.span), error.message)
    return Diagnostic(where, f"{error.source.name}:{error.span}: {message}", ERROR, (other,))


def _warning(warning: TemplateWarning, analysis: Analysis) -> Diagnostic:
    return Diagnostic(Range.of(warning.span), _message(warning.message, warning.notes), WARNING)
