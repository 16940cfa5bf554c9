"""Part of stage 3 (compile_template): `{% include "file.tmpl" %}` (docs/language.md §2.1).
Resolves a name against the including file's folder, never outside the root folder of the
compile, reads (lang/size.py) and parses each file once per compile, bounds the expansion
(depth, count, and the tags it brings in), and reports a cycle at the include tag that closes
it, with the chain of tags."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from qrun.errors import TemplateCompileError, TemplateError, TemplateErrors, UsageError
from qrun.lang import ast
from qrun.lang import expr as ex
from qrun.lang.build import build_ast
from qrun.lang.parser import parse
from qrun.lang.size import NotAFile, Size, measure, read_template
from qrun.lang.text import check_encodable, normalize_text
from qrun.source import Source, Span

MAX_INCLUDE_DEPTH = 32
"""Includes nest at most this deep (the compiler and the runtime walk them recursively)."""
MAX_INCLUDES = 1000
"""A compile expands at most this many includes in all (a file included twice in a file
included twice ... grows as a power)."""


def load_template(source: Source) -> tuple[ast.Template, Size]:
    """Stages 1 and 2 for one source: its text checked (its tags counted: lang/size.py),
    parsed and built; and its size.

    Raises:
        TemplateErrors: as compile_source.
    """
    try:
        size = measure(source)
        unencodable = check_encodable(source)
        if unencodable is not None:
            raise unencodable
        tree = parse(source)
    except TemplateError as err:
        raise TemplateErrors([err]) from None
    return build_ast(tree, source), size


@dataclass(frozen=True, slots=True)
class _Open:
    """A template being expanded: its real path (None for a string), the folder its own
    includes are resolved in, and the include tag that brought it in (None at the top)."""

    real: str | None
    folder: str
    source: Source
    tag: Span | None


@dataclass
class Includes:
    """The includes of one compile. `root` is the folder no include may leave (None: includes
    are refused, a string template given no folder); `folder` the top template's own folder;
    `counted` the tags and items of the compile so far (lang/size.py: the top template's, then
    each expansion's)."""

    root: str | None
    folder: str = "."
    top_path: str | None = None
    counted: Size = Size()
    expanded: int = field(default=0, init=False)  # includes expanded so far
    _stack: list[_Open] = field(default_factory=list, init=False)
    # Each file parsed once per compile (by real path): its AST, or its own syntax errors.
    _parsed: dict[str, tuple[Source, ast.Template, Size] | TemplateErrors] = field(
        default_factory=dict, init=False)

    @classmethod
    def for_file(cls, path: str, include_dir: str | None, size: Size) -> Includes:
        """A file's includes (the file holds `size`): relative to its folder, inside
        `include_dir` (default: that folder)."""
        folder = os.path.dirname(path) or "."
        return cls(include_dir if include_dir is not None else folder, folder, path, size)

    def start(self, source: Source) -> None:
        """The top template of the compile."""
        real = os.path.realpath(self.top_path) if self.top_path is not None else None
        self._stack = [_Open(real, self.folder, source, None)]

    def load(self, node: ast.Include, source: Source
             ) -> tuple[str, Source, ast.Template] | list[TemplateError]:
        """The name, source and AST of the template `node` (in `source`) includes, or why it
        cannot be included."""
        def fail(message: str, *notes: str) -> list[TemplateError]:
            return [TemplateCompileError(message, node.span, source, notes)]

        if self.root is None:
            return fail("'{% include %}' in a template given as a string needs a folder to "
                        "include from", "compile_source(text, include_dir=FOLDER) or "
                        "Query(text, include_dir=FOLDER); a file includes from its own folder")
        name = node.template.value if isinstance(node.template, ex.Const) else None
        if not isinstance(name, str):
            return fail("the included template must be a string literal",
                        "includes are resolved when the template compiles")
        if not name or "\0" in name or os.path.isabs(name):
            return fail(f"cannot include {ex.literal_text(name)}: the name must be a relative "
                        "path")
        path = os.path.normpath(os.path.join(self._stack[-1].folder, name))
        real = os.path.realpath(path)
        root = os.path.realpath(self.root)
        if os.path.commonpath([root, real]) != root:
            return fail(f"cannot include {ex.literal_text(name)}: {path} is outside the folder "
                        f"templates include from ({self.root})")
        refusal = self._refusal(real)
        if refusal is not None:
            return fail(*refusal)
        if real not in self._parsed:
            text = _read(path)
            if isinstance(text, tuple):
                return fail(*text)
            self._parsed[real] = (text if isinstance(text, TemplateErrors)
                                  else _parse(Source(path, normalize_text(text))))
        parsed = self._parsed[real]
        if isinstance(parsed, TemplateErrors):
            return list(parsed.errors)
        included, template, size = parsed
        over = (self.counted + size).over()
        if over is not None:
            return fail(f"cannot include {ex.literal_text(name)}: the compile would hold {over}",
                        "an included template counts each time it is included")
        self.counted += size
        return name, included, template

    @contextmanager
    def entered(self, source: Source, tag: Span) -> Iterator[None]:
        """While the compiler walks the body of `source`, included by `tag`."""
        self.expanded += 1
        folder = os.path.dirname(source.name) or "."
        self._stack.append(_Open(os.path.realpath(source.name), folder, source, tag))
        try:
            yield
        finally:
            self._stack.pop()

    def _refusal(self, real: str) -> tuple[str, ...] | None:
        if len(self._stack) > MAX_INCLUDE_DEPTH:
            return (f"includes nest too deeply (more than {MAX_INCLUDE_DEPTH})",)
        if self.expanded >= MAX_INCLUDES:
            return (f"too many includes (more than {MAX_INCLUDES} in all)",)
        reals = [entry.real for entry in self._stack]
        if real not in reals:
            return None
        chain = self._stack[reals.index(real):]
        names = " -> ".join([entry.source.name for entry in chain] + [chain[0].source.name])
        return (f"include cycle: {names}",
                *(f"{outer.source.name}:{inner.tag} includes {inner.source.name}"
                  for outer, inner in zip(chain, chain[1:], strict=False)))


def _read(path: str) -> str | TemplateErrors | tuple[str]:
    """The text of the file at `path`, its error (too large), or (why it cannot be read,)."""
    try:
        return read_template(path)
    except NotAFile as err:
        return (f"cannot include {path}: {err}",)
    except OSError as err:
        reason = "not found" if isinstance(err, FileNotFoundError) else err.strerror
        return (f"cannot include {path}: {reason}",)
    except UsageError as err:
        return (str(err),)


def _parse(included: Source) -> tuple[Source, ast.Template, Size] | TemplateErrors:
    try:
        template, size = load_template(included)
    except TemplateErrors as errors:
        return errors
    if template.front_matter is not None:
        return TemplateErrors([TemplateCompileError(
            "an included template cannot have front matter", template.front_matter.span,
            included, ["front matter belongs to the template that is run"])])
    return included, template, size
