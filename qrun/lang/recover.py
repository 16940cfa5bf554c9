"""The errors past a syntax error (docs/language.md §13): a template with a typo in one tag
still gets its other mistakes reported, by `qrun --check`, `Query` and the language server.

The tag holding a syntax error is blanked (its characters become spaces, newlines kept, so every
position stays where it was) and the text is parsed again, up to MAX_ERRORS syntax errors. Once
it parses, the blanked text is built and compiled, and what that finds is reported with the
syntax errors, less what a blanked tag may have caused: errors about a name the blanked tags
mention (a blanked `{% set x = %}` leaves `x` unknown), and everything once the blocks no
longer pair (a blanked `{% if %}` leaves its `{% endif %}` alone)."""

from __future__ import annotations

import re
from collections.abc import Callable

from qrun.errors import QrunError, TemplateError, TemplateErrors, TemplateSyntaxError
from qrun.lang import ast
from qrun.lang.build import build_ast
from qrun.lang.parser import parse
from qrun.source import Source

MAX_ERRORS = 50  # as the compiler reports at most (lang/compiler.py)
# Characters parsed again in all, at most: each tag set aside costs a parse of the whole text
# (about 0.2 s a megabyte here), so a template at the 1 MB limit gets 5 more looks.
MAX_REPARSED_CHARS = 5_000_000

_OPENER = re.compile(r"\{[{%#]")
_CLOSER = {"{{": "}}", "{%": "%}", "{#": "#}"}
_QUOTED_NAME = re.compile(r"'([A-Za-z_]\w*)'")
_WORD = re.compile(r"[A-Za-z_]\w*")


def errors_past(syntax: TemplateErrors, source: Source,
                compile_blanked: Callable[[ast.Template, Source], object]) -> TemplateErrors:
    """`syntax` (the parse's error) with the errors found past it: more syntax errors, then
    what `compile_blanked` raises for the text with every failing tag blanked (it compiles a
    template as the caller would, with its includes and functions)."""
    found: list[TemplateError] = list(syntax.errors)
    if len(found) != 1 or not isinstance(found[0], TemplateSyntaxError) or \
            not found[0].in_tag:
        return syntax  # text that cannot be encoded, a size limit: reported alone
    text, blanked = source.text, []
    error: TemplateError | None = found[0]
    looks = MAX_REPARSED_CHARS // max(1, len(text))
    while error is not None and len(found) < MAX_ERRORS and looks > 0:
        looks -= 1
        tag = _tag_around(text, error.span.start)
        if tag is None:
            return TemplateErrors(found)  # an unclosed tag or string: nothing after it parses
        blanked.append(text[tag[0]:tag[1]])
        text = text[:tag[0]] + re.sub(r"[^\n]", " ", text[tag[0]:tag[1]]) + text[tag[1]:]
        repaired = Source(source.name, text)
        try:
            tree = parse(repaired)
        except TemplateSyntaxError as err:
            if not err.in_tag:
                break
            error = _moved(err, source)
            if not _closes_a_blanked_tag(error.message, blanked):
                found.append(error)
            continue
        error = None
        try:
            template = build_ast(tree, repaired)
        except TemplateError:
            break  # the blocks no longer pair (a blanked `{% if %}`): nothing more is sure
        try:
            compile_blanked(template, repaired)
        except TemplateError as errors:
            names = {w for tag_text in blanked for w in _WORD.findall(tag_text)}
            more = errors.errors if isinstance(errors, TemplateErrors) else (errors,)
            found += [_moved(e, source) for e in more
                      if not names & set(_QUOTED_NAME.findall(e.message))]
        except QrunError:
            break  # not a template error (an unreadable include): the syntax errors stand
    return TemplateErrors(found[:MAX_ERRORS])


def _tag_around(text: str, at: int) -> tuple[int, int] | None:
    """The span of the tag that holds offset `at` (its opener at or before it, its closer
    after), or None."""
    opener = None
    for m in _OPENER.finditer(text, 0, at + 2):
        if m.start() <= at:
            opener = m
    if opener is None:
        return None
    end = text.find(_CLOSER[opener.group(0)], max(at, opener.end()))
    return None if end < 0 else (opener.start(), end + 2)


def _closes_a_blanked_tag(message: str, blanked: list[str]) -> bool:
    """Whether `message` is `unknown tag 'endNAME'` after a blanked `{% NAME ... %}` (an
    unknown block's end is no second mistake)."""
    closing = re.fullmatch(r"unknown tag 'end(\w+)'", message)
    return closing is not None and any(
        re.match(rf"\{{%-?\s*{closing.group(1)}\b", tag) for tag in blanked)


def _moved(error: TemplateError, source: Source) -> TemplateError:
    """`error`, shown on the original text (the blanked text's positions are the same)."""
    moved = type(error).__new__(type(error))  # the same class and fields, another source
    moved.__dict__.update(error.__dict__)
    moved.args, moved.source = error.args, source
    return moved
