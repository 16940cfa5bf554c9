"""What the language server knows of one document: its text compiled as `qrun --check FILE`
compiles the file (lang/front_end.py, the same stages, but on the editor's text, which may not
be saved), keeping what each stage produced, so hover and definition work on a template that
parses but does not compile. Positions here are plain data: 0-based lines and columns counted
in characters (code points) of the normalized text (lang/text.py keeps line numbers); the
server (qrun/lsp/server.py) converts them to the client's units."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from qrun.errors import QrunError, TemplateError, TemplateErrors, TemplateWarning
from qrun.lang import ast, ir
from qrun.lang import expr as ex
from qrun.lang.front_end import FrontEnd
from qrun.lang.names import Signatures
from qrun.source import Source, Span


@dataclass(frozen=True, slots=True)
class Range:
    """0-based start and end (line, character) of a piece of a document (characters are code
    points of the normalized text)."""

    line: int
    character: int
    end_line: int
    end_character: int

    @classmethod
    def of(cls, span: Span) -> Range:
        return cls(span.line - 1, span.column - 1, span.end_line - 1, span.end_column - 1)


@dataclass(frozen=True, slots=True)
class Analysis:
    """A document compiled: `source` (named by the document's path), the AST when the text
    parses (`template`), the program when it compiles (`program`), the errors `--check`
    reports (every one, in source order), and the compiler's warnings."""

    source: Source
    template: ast.Template | None
    program: ir.Program | None
    errors: tuple[QrunError, ...]
    warnings: tuple[TemplateWarning, ...]

    def offset(self, line: int, character: int) -> int:
        """The text offset of a 0-based (line, character), clamped to the text."""
        starts = self.source.line_starts()
        if line < 0:
            return 0
        if line >= len(starts):
            return len(self.source.text)
        end = starts[line + 1] - 1 if line + 1 < len(starts) else len(self.source.text)
        return min(starts[line] + max(character, 0), end)


def analyze(text: str, path: str, functions: Signatures | None = None) -> Analysis:
    """Compile `text` as the template file at `path` through the one front end
    (lang/front_end.py), with the host `functions` the server was started with (`qrun lsp
    --functions FILE.py`, as `qrun --check --functions`): includes and `call()` targets are
    resolved as for `qrun --check path` (relative to the file's folder, never outside it:
    lang/include.py). Never raises for any text: an error of the compiler itself becomes one
    error at the start of the document, so that a bug cannot stop the server.

    Work is bounded by the compiler's own limits (lang/size.py: characters, tags and the items
    inside them, counted before parsing; includes by depth and count)."""
    try:
        front = FrontEnd(text, path)
    except TemplateErrors as errors:  # over the size limit
        return Analysis(errors.source, None, None, errors.errors, ())
    source = front.source
    try:
        template = front.parse()
    except TemplateErrors as errors:
        try:
            errors = front.errors_past(errors, front.includes_of_file(), functions)
        except Exception:  # RecursionError, or a bug in qrun: the syntax error stands
            pass
        return Analysis(source, None, None, errors.errors, ())
    except Exception as err:  # RecursionError, or a bug in qrun
        return _failed(source, None, err)
    try:
        program = front.compile(front.includes_of_file(), functions)
    except TemplateErrors as errors:
        return Analysis(source, template, None, errors.errors, ())
    except QrunError as error:
        return Analysis(source, template, None, (error,), ())
    except Exception as err:  # RecursionError, or a bug in qrun
        return _failed(source, template, err)
    return Analysis(source, template, program, (), program.warnings)


def _failed(source: Source, template: ast.Template | None, err: Exception) -> Analysis:
    """A stage that raised what no template should make it raise, reported where the editor
    shows it: nesting too deep for Python's stack, or a bug in qrun."""
    message = ("the template nests too deeply to analyze" if isinstance(err, RecursionError)
               else f"qrun internal error: {type(err).__name__}: {err} (please report it)")
    return Analysis(source, template, None, (_internal(source, message),), ())


def _internal(source: Source, message: str) -> TemplateError:
    return TemplateError(message, source.span_at(0), source)


def folder_of(path: str) -> str:
    """The folder a document's includes are relative to (and stay inside)."""
    return os.path.dirname(path) or "."


# ---- walking the AST: every expression, every hole, with what encloses it ---------------------


@dataclass(frozen=True, slots=True)
class HoleSite:
    """A gen or select hole as written, and whether a loop encloses it (its capture is then
    a list)."""

    node: ast.Gen | ast.Select
    in_loop: bool


def holes(template: ast.Template) -> Iterator[HoleSite]:
    """Every hole of the document, in source order (macro bodies included)."""
    def visit(nodes: tuple[ast.Node, ...], in_loop: bool) -> Iterator[HoleSite]:
        for node in nodes:
            if isinstance(node, ast.Gen | ast.Select):
                yield HoleSite(node, in_loop)
            looping = in_loop or isinstance(node, ast.For | ast.While | ast.Fork)
            yield from visit(tuple(ast.children(node)), looping)

    yield from visit(template.body, False)


def node_exprs(node: ast.Node) -> Iterator[ex.Expr]:
    """The expressions written in `node` itself (not in its body)."""
    match node:
        case ast.Interp(expr=expr) | ast.Return(expr=expr) | ast.Set(expr=expr) | ast.While(
                test=expr) | ast.Include(template=expr):
            yield expr
        case ast.Gen(args=args) | ast.Select(args=args) | ast.Role(args=args):
            yield from (arg.expr for arg in args)
        case ast.If(arms=arms):
            yield from (arm.test for arm in arms)
        case ast.For(iterable=iterable) | ast.Fork(iterable=iterable) | ast.Particles(
                count=iterable):
            yield iterable
        case ast.Macro(params=params):
            yield from (p.default for p in params if p.default is not None)
        case (ast.Text() | ast.Break() | ast.Continue() | ast.Try() | ast.Hidden()
              | ast.Fresh()):
            pass


def all_exprs(template: ast.Template) -> Iterator[ex.Expr]:
    """Every expression of the document, sub-expressions included, in source order."""
    for node in ast.walk(template.body):
        for expr in node_exprs(node):
            yield from ex.walk(expr)


def contains(span: Span, offset: int) -> bool:
    """Whether `offset` is inside `span` (its end included: the cursor after a name is on
    it)."""
    return span.start <= offset <= span.end


def input_names(analysis: Analysis) -> tuple[str, ...]:
    """The inputs the document takes: the program's (declared or found), or, when it does not
    compile, those its front matter declares."""
    program = analysis.program
    if program is not None:
        return (*program.inputs, *program.optional_inputs)
    if analysis.template is None or analysis.template.front_matter is None:
        return ()
    for entry in analysis.template.front_matter.entries:
        if entry.key == "inputs":
            if isinstance(entry.data, list):
                return tuple(str(n) for n in entry.data if isinstance(n, str))
            if isinstance(entry.data, dict):
                return tuple(str(n) for n in entry.data)
    return ()
