"""The whole front end, text to program, in one place for every face: the size check, text
normalization (lang/text.py), parsing and the AST (lang/include.py load_template), then the
compiler with includes and host functions (lang/compiler.py). `Query`, `qrun --check` and the
language server (qrun/lsp/analysis.py) all compile through it, so what one accepts the others
accept; `FrontEnd` keeps each stage's output for the editor, which shows a template that parses
but does not compile."""

from __future__ import annotations

import os

from qrun.errors import TemplateErrors, UsageError
from qrun.lang import ast, ir
from qrun.lang.compiler import compile_template
from qrun.lang.include import Includes, load_template
from qrun.lang.names import Signatures
from qrun.lang.recover import errors_past
from qrun.lang.size import MAX_TEMPLATE_SIZE, NotAFile, Size, read_template, too_large
from qrun.lang.text import normalize_text
from qrun.source import Source

PathLike = str | os.PathLike[str]


class FrontEnd:
    """One template text on its way to a program, named `name` in errors: `source` (the
    normalized text) at once, `template` once `parse` has run.

    Raises (on construction):
        TemplateErrors: the text is over MAX_TEMPLATE_SIZE characters (lang/size.py).
    """

    def __init__(self, text: str, name: str) -> None:
        if len(text) > MAX_TEMPLATE_SIZE:
            raise too_large(name, text, len(text), "characters")
        self.source = Source(name, normalize_text(text))
        self.template: ast.Template | None = None
        self.size = Size()  # what parsing counted, which includes add to (lang/size.py)

    def parse(self) -> ast.Template:
        """The AST (kept in `template`).

        Raises:
            TemplateErrors: a syntax error, or a size limit passed (text that cannot be
                encoded is reported alone).
        """
        self.template, self.size = load_template(self.source)
        return self.template

    def compile(self, includes: Includes, functions: Signatures | None = None) -> ir.Program:
        """The program of the parsed template (`parse` first: its size counts towards the
        includes' limits); `includes` resolves `{% include %}`, `functions` are the host
        functions the template may call (their arguments checked).

        Raises:
            TemplateErrors: every error found, in source order.
        """
        assert self.template is not None, "parse() comes first"
        return compile_template(self.template, self.source, includes, functions)

    def errors_past(self, syntax: TemplateErrors, includes: Includes,
                    functions: Signatures | None = None) -> TemplateErrors:
        """`syntax` (what `parse` raised) with the errors past it: the template's other syntax
        errors and what compiling it with those tags blanked finds (lang/recover.py)."""
        return errors_past(syntax, self.source, lambda template, source: compile_template(
            template, source, includes, functions))

    def includes_from(self, include_dir: PathLike | None) -> Includes:
        """Includes of a template given as text: refused unless `include_dir` names the
        folder to include from."""
        folder = os.fspath(include_dir) if include_dir is not None else None
        return Includes(folder, folder or ".", counted=self.size)

    def includes_of_file(self, root: PathLike | None = None) -> Includes:
        """Includes of the template file `source.name`: relative to it, inside `root` (by
        default its folder)."""
        return Includes.for_file(self.source.name,
                                 os.fspath(root) if root is not None else None, self.size)


def compile_source(text: str, name: str = "<string>", include_dir: PathLike | None = None,
                   functions: Signatures | None = None) -> ir.Program:
    """Parse, build and compile template `text` (reported under `name`). The text is
    normalized first (lang/text.py: newlines as Jinja writes them, no byte order mark).
    `{% include %}` is refused unless `include_dir` names the folder to include from.
    `functions` are the host functions the template may call (their arguments are checked).

    Raises:
        TemplateErrors: every error found, in source order (past a syntax error too, with
            its tag blanked: lang/recover.py; text that cannot be encoded, and a template over
            a size limit of lang/size.py, stop the parse, so each is reported alone).
    """
    front = FrontEnd(text, name)
    try:
        front.parse()
    except TemplateErrors as errors:
        raise front.errors_past(errors, front.includes_from(include_dir), functions) from None
    return front.compile(front.includes_from(include_dir), functions)


def compile_file(path: PathLike, include_dir: PathLike | None = None,
                 functions: Signatures | None = None) -> ir.Program:
    """Compile the UTF-8 template file at `path`; errors are reported under that path. Its
    includes are relative to the including file, and stay inside `include_dir` (by default
    the folder of `path`).

    Raises:
        UsageError: the file cannot be read, is not a regular file (a directory, a named pipe,
            a device), or is not UTF-8 (a UTF-16 file is named so).
        TemplateErrors: as compile_source (a file over MAX_TEMPLATE_SIZE bytes is one).
    """
    name = os.fspath(path)
    try:
        text = read_template(name)
    except (NotAFile, OSError) as err:
        raise UsageError(f"cannot read template {name}: {err}") from None
    if isinstance(text, TemplateErrors):
        raise text
    front = FrontEnd(text, name)
    try:
        front.parse()
    except TemplateErrors as errors:
        raise front.errors_past(errors, front.includes_of_file(include_dir),
                                functions) from None
    return front.compile(front.includes_of_file(include_dir), functions)
