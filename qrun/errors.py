"""The exception hierarchy: every error a user can cause is a QrunError with an exit code,
and every error about a template carries the Span of the text it is about."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qrun.source import Source, Span, excerpt


class QrunError(Exception):
    """Base of all errors qrun reports to users (the CLI prints them without a traceback)."""

    exit_code = 1


class UsageError(QrunError):
    """Bad command-line or API usage: unknown option value, unreadable file, bad --vars."""

    exit_code = 2


class ModelLoadError(QrunError):
    """A model could not be found or loaded; the message says how to fix it."""

    exit_code = 2


class BackendError(QrunError):
    """A model backend failed to run a request (vLLM's engine, or a server that refused or
    could not be reached); reported at the hole it was filling."""


class TemplateError(QrunError):
    """An error about a place in a template: `message` at `span` of `source`, plus notes
    (e.g. "expected one of ...", "did you mean ...?") printed after the caret."""

    exit_code = 2

    def __init__(
        self, message: str, span: Span, source: Source, notes: Iterable[str] = ()
    ) -> None:
        self.message = message
        self.span = span
        self.source = source
        self.notes = tuple(notes)
        super().__init__(self.render())

    @property
    def kind(self) -> str:
        return "error"

    def render(self) -> str:
        where = f"{self.source.name}:{self.span.line}:{self.span.column}"
        head = f"{where}: {self.kind}: {self.message}"
        lines = [head, excerpt(self.source, self.span)]
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


class TemplateSyntaxError(TemplateError):
    """The template does not parse."""


class TemplateCompileError(TemplateError):
    """The template parses but is wrong: unknown names, bad arguments, unclosed blocks..."""


class ConstraintError(TemplateError):
    """A constraint (regex, named pattern, JSON Schema) is invalid or unsupported."""


class InputError(TemplateError):
    """A run's inputs do not fit the template (a declared input is missing), found before any
    model work."""


class GenerationError(TemplateError):
    """A hole could not be filled legally: max_tokens ran out before the constraint accepted,
    or no token could continue. Carries the hole's span. A run-time failure (exit 1)."""

    exit_code = 1


class EvaluationError(TemplateError):
    """An expression failed at run time (e.g. a key missing from an input dict)."""

    exit_code = 1


class TemplateErrors(QrunError):
    """Several template errors found in one pass, reported together in source order."""

    exit_code = 2

    def __init__(self, errors: Sequence[TemplateError]) -> None:
        assert errors, "TemplateErrors needs at least one error"
        self.errors = tuple(sorted(errors, key=lambda e: (e.span.start, e.message)))
        super().__init__("\n".join(e.render() for e in self.errors))

    @property
    def first(self) -> TemplateError:
        return self.errors[0]
