"""Stage 0, before parsing (docs/language.md §13, "Size"): how large a template may be. A
template file is read only when it is a regular file, and only up to MAX_TEMPLATE_SIZE; its
tags and what they hold are counted by a cheap scan, so that a hostile template is refused in
a fifth of a second instead of parsed for minutes (parsing costs ~15-25 us per name, number or
symbol inside a tag, and text between tags almost nothing). Figures: a shared 2-core machine."""

from __future__ import annotations

import codecs
import functools
import os
import re
import stat
from dataclasses import dataclass

from qrun.errors import TemplateErrors, TemplateSyntaxError
from qrun.lang.parser import terminal_regex
from qrun.lang.text import decode_template, normalize_text
from qrun.source import Source

MAX_TEMPLATE_SIZE = 4_000_000
"""Characters of a template given as a string; bytes of a template file (included ones too).
4 MB of text without tags compiles in 0.45 s."""
MAX_TAGS = 10_000
"""Tags (`{{`, `{%`, `{#`; a raw block is one) in one compile, an included file counted each
time it is included: 10,000 `{{ x }}` compile in 0.7-1.1 s, 20,000 in 2.4-2.8 s, 100,000 in 13 s."""
MAX_TAG_ITEMS = 50_000
"""Names, numbers, strings, operators and brackets inside the tags of one compile (a list of
string literals is one; `==` is two): a 50,000-item list literal compiles in 0.7 s, 5,000
`{{ a + b + c + d + e }}` (50,000 items) in 1.2-1.8 s, the slowest shape measured."""

_OPENER = re.compile(r"\{[{%#]")
# grammar.lark's RAW in two parts: the scan looks for the end only after a raw tag.
_RAW_OPEN = re.compile(r"\{%-?[ \t\r\n]*raw[ \t\r\n]*-?%\}")
_RAW_CLOSE = re.compile(r"\{%-?[ \t\r\n]*endraw[ \t\r\n]*-?%\}")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))
_NOTE = ("qrun refuses templates this large so that no template can hang a compile "
         "(docs/language.md §13)")


class NotAFile(Exception):
    """The path names something other than a regular file; the message says what."""


@dataclass(frozen=True, slots=True)
class Size:
    """What a template's tags hold, counted before parsing: `tags` (each `{{`, `{%` and `{#`;
    a raw block is one) and `items` (inside them; see MAX_TAG_ITEMS)."""

    tags: int = 0
    items: int = 0

    def __add__(self, other: Size) -> Size:
        return Size(self.tags + other.tags, self.items + other.items)

    def over(self) -> str | None:
        """Which limit this size is past, in words, or None."""
        if self.tags > MAX_TAGS:
            return f"more than {MAX_TAGS:,} tags"
        if self.items > MAX_TAG_ITEMS:
            return f"more than {MAX_TAG_ITEMS:,} names, values and symbols inside tags"
        return None


def read_template(path: str) -> str | TemplateErrors:
    """The text of the template file at `path` (decoded, not yet normalized), or the error
    that it is larger than MAX_TEMPLATE_SIZE bytes (at its first byte past the limit). Only a
    regular file is opened, without blocking, and at most MAX_TEMPLATE_SIZE + 1 bytes are read,
    so a named pipe, a device or a file that grows meanwhile cannot hang the compile.

    Raises:
        NotAFile: it is a directory, a named pipe, a device or a socket.
        OSError: it cannot be opened or read.
        UsageError: it is not UTF-8 text (lang/text.py).
    """
    _check_kind(os.stat(path).st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(path, flags), "rb") as handle:
        info = os.fstat(handle.fileno())
        _check_kind(info.st_mode)  # replaced since the stat above
        data = handle.read(MAX_TEMPLATE_SIZE + 1)
    if len(data) <= MAX_TEMPLATE_SIZE:
        return decode_template(data, path)
    # Decoded as far as the limit (an invalid byte is replaced: the size is the error here).
    head = codecs.getincrementaldecoder("utf-8")("replace").decode(data[:MAX_TEMPLATE_SIZE])
    grew = info.st_size <= MAX_TEMPLATE_SIZE  # it grew since the fstat: its size is unknown
    return too_large(path, head, None if grew else info.st_size, "bytes")


def missing_or_odd(path: str | os.PathLike[str]) -> str:
    """Why `path`, neither a folder nor a regular file, cannot be a template: `no such file
    or folder`, or what it is (`it is a named pipe (FIFO), not a file`)."""
    try:
        _check_kind(os.stat(path).st_mode)
    except NotAFile as err:
        return str(err)
    except OSError:
        pass
    return "no such file or folder"


def _check_kind(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotAFile(f"it is {kind}, not a file" if kind.startswith("a ") else kind)


def too_large(name: str, text: str, size: int | None, unit: str) -> TemplateErrors:
    """The error for a template of `size` `unit` (characters or bytes; None: more than
    MAX_TEMPLATE_SIZE, not known how many), at its first character past the limit. `text`
    holds at least the template's first MAX_TEMPLATE_SIZE characters (the rest is ignored)."""
    source = Source(name, normalize_text(text[:MAX_TEMPLATE_SIZE]))
    shown = f"more than {MAX_TEMPLATE_SIZE:,}" if size is None else f"{size:,}"
    return TemplateErrors([TemplateSyntaxError(
        f"the template is too large: {shown} {unit} (at most {MAX_TEMPLATE_SIZE:,})",
        source.end_span(), source, ["this is the first character past the limit", _NOTE])])


def measure(source: Source) -> Size:
    """The tags of `source` and the items inside them, counted (as far as the limits) without
    parsing.

    Raises:
        TemplateErrors: more than MAX_TAGS tags or MAX_TAG_ITEMS items; at the first tag (or
            item) past the limit.
    """
    text = source.text
    tags = items = 0
    front = _pattern("FRONT_MATTER").match(text)
    pos = front.end() if front is not None else 0
    while (opener := _OPENER.search(text, pos)) is not None:
        tags += 1
        if tags > MAX_TAGS:
            # The rest counted as openers (in C: scanning 500,000 more tags would take ~3 s).
            total = tags + len(_OPENER.findall(text, opener.end()))
            raise _too_many_tags(source, opener.start(), total)
        end: int | None
        if opener.group() == "{#":
            end = text.find("#}", opener.end())
            end = None if end < 0 else end + 2
        elif (raw := _RAW_OPEN.match(text, opener.start())) is not None:
            close = _RAW_CLOSE.search(text, raw.end())
            end = None if close is None else close.end()
        else:
            end, items = _tag_end(source, opener.end(), opener.group() == "{%", items)
        if end is None:  # an unclosed comment, raw block or tag: the parser reports it
            break
        pos = end
    return Size(tags, items)


def _tag_end(source: Source, pos: int, block: bool, items: int) -> tuple[int | None, int]:
    """Where the tag whose body starts at `pos` ends (None: it does not), and `items` plus
    its items. Follows the parser where it goes on: a `}` closes a bracket before it can
    close a `{{` tag (so `{"a": {"b": 1}}} }}` is one tag), strings are skipped whole, and a
    list of string literals counts once, as it is one token; where the scan stops short the
    parser stops too, with a syntax error."""
    text, depth = source.text, 0
    while (item := _item().match(text, pos)) is not None:
        items += 1
        if items > MAX_TAG_ITEMS:
            raise _too_many_items(source, item.start(1), item.end(1))
        pos, word = item.end(), item.group(1)
        if block and word == "%" and text.startswith("}", pos):
            return pos + 1, items
        if word in ("(", "[", "{"):
            depth += 1
        elif word in (")", "]") or (word == "}" and depth):
            depth = max(0, depth - 1)
        elif word == "}":
            close = _item().match(text, pos)
            return (close.end() if close is not None and close.group(1) == "}" else pos), items
    return None, items


@functools.cache
def _item() -> re.Pattern[str]:
    """One item inside a tag, after any white space: a list of string literals, a string, a
    name or number, or any other character (operators count a character each)."""
    strings = "|".join(terminal_regex(name) for name in ("STRING_LIST", "STRING"))
    return re.compile(rf"[ \t\r\n]*({strings}|\w+|[^ \t\r\n])")


@functools.cache
def _pattern(terminal: str) -> re.Pattern[str]:
    return re.compile(terminal_regex(terminal))


def _too_many_tags(source: Source, at: int, total: int) -> TemplateErrors:
    return TemplateErrors([TemplateSyntaxError(
        f"too many tags: {total:,} (at most {MAX_TAGS:,})", source.span_at(at, 2), source,
        [f"this is the first tag past the limit; the template has {len(source.text):,} "
         "characters", _NOTE])])


def _too_many_items(source: Source, start: int, end: int) -> TemplateErrors:
    return TemplateErrors([TemplateSyntaxError(
        f"the tags hold too much: more than {MAX_TAG_ITEMS:,} names, values and symbols",
        source.span_at(start, end - start), source,
        [f"this is the first past the limit; the template has {len(source.text):,} "
         "characters",
         "a long list or dict is better given as an input (-v NAME:=JSON, --vars FILE.json, "
         "or run(NAME=value))", _NOTE])])
