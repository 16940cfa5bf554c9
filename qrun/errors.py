"""The exception hierarchy: every error a user can cause is a QrunError with an exit code,
and every error about a place in a template carries the Span of the text it is about.

    QrunError
    ├── UsageError (2)            bad options, unreadable files, inputs that are not plain data
    │   └── InputError (2)        a declared input is missing (positioned)
    ├── ModelLoadError (2)
    ├── TemplateError (2)         the template is wrong: what `qrun --check` reports
    │   ├── TemplateSyntaxError, TemplateCompileError, ConstraintError
    │   └── TemplateErrors        several of them, found in one pass
    ├── GenerationError (1)       run-time failures (positioned), never TemplateErrors
    ├── EvaluationError (1)
    └── BackendError (1)

So `except TemplateError` catches every compile error (the group included) and nothing that
only happens while running; PositionedError carries the span rendering both kinds share.
TemplateWarning, never raised, is a template that compiles but likely does not mean what it
says: rendered like an error, with "warning:". QueueFull and RunCancelled are no QrunErrors:
they are about admission to a model's runs (qrun/runtime/runner.py), which a server answers
429 and 503/504, not about the template or its inputs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from qrun.source import Source, Span, excerpt, printable


class QrunError(Exception):
    """Base of all errors qrun reports to users (the CLI prints them without a traceback)."""

    exit_code = 1


class UsageError(QrunError):
    """Bad command-line or API usage: unknown option value, unreadable file, bad --vars, an
    input value that is not plain data."""

    exit_code = 2


class ModelLoadError(QrunError):
    """A model could not be found or loaded; the message says how to fix it."""

    exit_code = 2


class QueueFull(Exception):
    """Every run slot of an admission is taken and its queue holds `max_queue` runs already
    (qrun/runtime/runner.py)."""


class RunCancelled(Exception):
    """The run's request timed out or went away: the run ends at its next forward, which
    frees its KV cache (the session closes as the exception unwinds it)."""


class BackendError(QrunError):
    """A model backend failed to run a request (vLLM's engine, or a server that refused or
    could not be reached); reported at the hole it was filling."""


def render_at(kind: str, message: str, span: Span, source: Source, notes: Iterable[str]) -> str:
    """`FILE:LINE:COL: KIND: MESSAGE`, the source line with a caret under the span, and one
    line per note."""
    head = f"{source.name}:{span.line}:{span.column}: {kind}: {message}"
    lines = [head, excerpt(source, span)]
    lines.extend(f"  note: {note}" for note in notes)
    return printable("\n".join(lines))


class PositionedError(QrunError):
    """An error about a place in a template: `message` at `span` of `source`, plus notes
    (e.g. "expected one of ...", "did you mean ...?") printed after the caret. Shared by
    compile errors (TemplateError) and run-time ones (GenerationError, EvaluationError); it
    sets no exit code of its own, so each branch keeps its own."""

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
        return render_at(self.kind, self.message, self.span, self.source, self.notes)


class TemplateError(PositionedError):
    """The template is wrong (found without running it, by `qrun --check` and compile_source,
    or, for a chat role the model cannot render, when the run reaches it)."""

    exit_code = 2


class TemplateSyntaxError(TemplateError):
    """The template does not parse. `in_tag`: the parser found it where it was reading, so
    the front end may set that tag aside and look for more errors (lang/recover.py)."""

    in_tag = False


class TemplateCompileError(TemplateError):
    """The template parses but is wrong: unknown names, bad arguments, unclosed blocks..."""


class ConstraintError(TemplateError):
    """A constraint (regex, named pattern, JSON Schema) is invalid or unsupported."""


class TemplateErrors(TemplateError):
    """Several template errors found in one pass, reported together in source order. Its own
    message, span and source are those of the first; `errors` holds them all (a nested group
    is flattened into its members)."""

    errors: tuple[TemplateError, ...]

    def __init__(self, errors: Sequence[TemplateError]) -> None:
        flat = [e for error in errors for e in
                (error.errors if isinstance(error, TemplateErrors) else (error,))]
        assert flat, "TemplateErrors needs at least one error"
        self.errors = tuple(sorted(flat, key=lambda e: (e.span.start, e.message)))
        first = self.errors[0]
        super().__init__(first.message, first.span, first.source, first.notes)

    @property
    def first(self) -> TemplateError:
        return self.errors[0]

    def render(self) -> str:
        return "\n".join(e.render() for e in self.errors)


class InputError(PositionedError, UsageError):
    """A run's inputs do not fit the template (a declared input is missing), found before any
    model work; positioned at the input's first use. A usage error (exit 2), not a
    TemplateError: the template itself is fine."""


class GenerationError(PositionedError):
    """A hole could not be filled legally: max_tokens ran out before the constraint accepted,
    or no token could continue. Carries the hole's span. A run-time failure (exit 1)."""


class ContextTooLong(GenerationError):
    """The text before a hole (the template's with its inputs), or that text and the hole's
    tokens, are longer than the model's context: the request's size and its max_tokens, not a
    failure of the run (qrun serve answers it 422)."""


class ValueCutOff(GenerationError):
    """A constrained hole's max_tokens ran out before its value matched the constraint: no
    valid value fits the budget the template (or the request) gave it."""


class EvaluationError(PositionedError):
    """An expression failed at run time (e.g. a key missing from an input dict, or the run's
    evaluation budget ran out); a run-time failure (exit 1)."""


class HostFunctionError(EvaluationError):
    """A host function the template called raised. Its message names the exception and its
    text, for the template's author; a server answers its clients with `public_message`
    only, and logs the rest (the text may hold paths, hosts or data: issue #38)."""

    def __init__(self, message: str, span: Span, source: Source, function: str,
                 notes: Iterable[str] = ()) -> None:
        self.function = function
        super().__init__(message, span, source, notes)

    @property
    def public_message(self) -> str:
        return f"{self.function}() failed (the server's log has why)"


class LimitError(EvaluationError):
    """The run hit one of its limits (qrun.Limits: steps, output, macro call depth...). An
    EvaluationError that `{% try %}` does not catch: a runaway template must end."""


@dataclass(frozen=True, slots=True)
class TemplateWarning:
    """A template that compiles but very likely does not do what it says (docs/language.md
    §13): `message` at `span` of `source`, and notes with the fix. Data, never raised: the
    compiled Program carries them (`Program.warnings`, `Query.warnings`) and the command line
    prints them to stderr, leaving the exit code alone."""

    message: str
    span: Span
    source: Source
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        return render_at("warning", self.message, self.span, self.source, self.notes)

    def __str__(self) -> str:
        return self.render()


def suggest(name: str, known: Iterable[str]) -> list[str]:
    """A "did you mean ...?" note for the closest known name, if any is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return [f"did you mean '{close[0]}'?"] if close else []
