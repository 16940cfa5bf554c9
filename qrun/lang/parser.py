"""Stage 1: source text -> lark.Tree. Builds the LALR parser once, and is the only place where
Lark errors are translated into TemplateSyntaxError (with a Span and an "expected ..." note)."""

from __future__ import annotations

import difflib
import functools
import re

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from qrun.errors import TemplateSyntaxError
from qrun.lang.parser_cache import cache_folder, open_cached
from qrun.lang.surface import TAG_HINTS, TEST_HINTS
from qrun.source import Source

# Terminals shown to users under another name; None hides one from "expected ..." lists.
_READABLE: dict[str, str | None] = {
    "$END": "end of template",
    "TEXT": "text",
    "COMMENT": None,
    "RAW": None,
    "FRONT_MATTER": None,
    "VAR_CLOSE_STRIP": None,
    "VAR_OPEN": "'{{'",
    "BLOCK_OPEN": "'{%'",
    "BLOCK_CLOSE": "'%}'",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "ROLE": "'system', 'user', 'assistant'",
    "ENDROLE": "'endsystem', 'enduser', 'endassistant'",
}
# What can start an expression: collapsed into "an expression" in messages.
_EXPR_START = frozenset({"NAME", "NUMBER", "STRING", "STRING_LIST", "(", "[", "{", "+", "-",
                         "not", "True", "False", "None"})
# What continues an expression: only listed when nothing structural is expected.
_OPERATORS = frozenset({"+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", "<=", ">", ">=",
                        ".", "[", "|", "(", "in", "not", "is", "and", "or", "if", "~"})
BLOCK_KEYWORDS = ("if", "elif", "else", "endif", "for", "endfor", "while", "endwhile",
                   "break", "continue", "set", "include", "macro", "endmacro", "return", "try",
                   "except", "endtry", "fork", "endfork", "particles", "endparticles",
                   "hidden", "endhidden", "fresh", "endfresh", "system", "endsystem", "user",
                   "enduser", "assistant", "endassistant", "raw")
_FRONT_MATTER_START = re.compile(r"---[ \t]*\r?\n")
_TEST_BEFORE = re.compile(r"\bis\s+(?:not\s+)?([A-Za-z_]\w*)\s*\Z")  # `x is divisibleby 3`
_OPENERS = {"VAR_OPEN": "'}}'", "BLOCK_OPEN": "'%}'"}
_STRING = re.compile(r""""(?:[^"\\\n]|\\[^\n])*"|'(?:[^'\\\n]|\\[^\n])*'""")  # grammar.lark's
_RAW_NOTE = ('drop the r: "\\n" is a newline, and a backslash before a character with no '
             'escape meaning stays as written ("\\d+" is the regex \\d+); "\\\\" is one backslash')
# Python's string prefixes, lower-cased: (message, note).
_STRING_PREFIXES = {
    "r": ("raw strings are not supported", _RAW_NOTE),
    "br": ("raw strings are not supported", _RAW_NOTE),
    "rb": ("raw strings are not supported", _RAW_NOTE),
    "b": ("byte strings are not supported", "drop the b: strings are text"),
    "u": ("string prefixes are not supported", "drop the u: strings are text"),
    "f": ("f-strings are not supported", "join text with `~`: `'Hello, ' ~ name`"),
    "rf": ("f-strings are not supported", "join text with `~`: `'Hello, ' ~ name`"),
    "fr": ("f-strings are not supported", "join text with `~`: `'Hello, ' ~ name`"),
}
# Part of the saved tables' key (lang/parser_cache.py): changing one builds the parser afresh.
_OPTIONS = {"parser": "lalr", "lexer": "contextual", "propagate_positions": True,
            "maybe_placeholders": True}


@functools.cache
def _parser() -> Lark:
    """The parser is immutable and costly to build (~0.3 s), so it is made once per process,
    from the tables an earlier process left in the user's cache folder when they still match
    (~30 ms: lang/parser_cache.py)."""
    return open_cached("qrun.lang", "grammar.lark", _OPTIONS, cache_folder())


def parse(source: Source) -> Tree[Token]:
    """Parse a template into a Lark tree (flat: blocks are paired later, by build_ast).

    Raises:
        TemplateSyntaxError: the text does not parse; the span points at the offending
            character (or at the unclosed tag when the template ends inside one), and
            `in_tag` is set; or the front matter is never closed.
    """
    try:
        tree = _parser().parse(source.text)
    except UnexpectedInput as err:
        error = _translate(err, source)
        error.in_tag = True
        raise error from None
    first = tree.children[0] if tree.children else None
    is_front_matter = isinstance(first, Token) and first.type == "FRONT_MATTER"
    if _FRONT_MATTER_START.match(source.text) and not is_front_matter:
        raise TemplateSyntaxError(
            "front matter is never closed", source.span_at(0, 3), source,
            ["the file starts with '---', so a line '---' must end the front matter"],
        )
    return tree


def terminal_regex(name: str) -> str:
    """The regular expression of terminal `name` of grammar.lark (lang/size.py scans templates
    with the parser's own patterns for strings and front matter)."""
    return str(_parser().get_terminal(name).pattern.to_regexp())


# ---- error translation -----------------------------------------------------------------------


def _translate(err: UnexpectedInput, source: Source) -> TemplateSyntaxError:
    text = source.text
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        return _unexpected_end(err, source)
    pos = err.token.start_pos if isinstance(err, UnexpectedToken) else err.pos_in_stream
    pos = pos if isinstance(pos, int) else len(text)
    if text.startswith("{#", pos):
        return TemplateSyntaxError("comment is never closed", source.span_at(pos, 2), source,
                                   ["expected '#}' to end the comment"])
    if text[pos:pos + 1] in ("'", '"'):
        return _misplaced_string(err, source, pos)
    word = _stack_top(err, "NAME")
    if word == "where" and _accepted(err) == {"EQUAL"} and _hole_kind(err) is not None:
        return _where_clause(word, source)
    opener = re.search(r"\{%-?[ \t\r\n]*\Z", text[max(0, pos - 40):pos])
    if opener is not None:
        return _bad_block_tag(pos, pos - len(opener.group(0)), source)
    expected = _accepted(err)
    notes = [*_test_note(text, pos), *_expected_notes(expected, err)]
    found = _describe(text, pos)
    notes.extend(_opener_note(err, source, pos))
    return TemplateSyntaxError(f"unexpected {found[0]}", source.span_at(pos, found[1]),
                               source, notes)


def _misplaced_string(err: UnexpectedInput, source: Source, pos: int) -> TemplateSyntaxError:
    """A quote where the parser does not take a string. Only a string that does not end on its
    line is "unterminated"; a closed one is misplaced: a quoted hole name (older guidance's
    `{{gen 'name'}}`), a string prefix (`r"\\d"`, `f"..."`) or a string the grammar does not
    expect there."""
    text = source.text
    closed = _STRING.match(text, pos)
    if closed is None:
        return TemplateSyntaxError(
            "unterminated string", source.span_at(pos, 1), source,
            ["a string must end on the line it starts on (write '\\n' for a newline)"])
    end = closed.end()
    prefix = re.search(r"(?<![\w.])[A-Za-z]{1,2}\Z", text[max(0, pos - 3):pos])
    if prefix is not None and prefix.group(0).lower() in _STRING_PREFIXES:
        start = pos - len(prefix.group(0))
        message, note = _STRING_PREFIXES[prefix.group(0).lower()]
        return TemplateSyntaxError(message, source.span_at(start, end - start), source, [note])
    hole = _hole_kind(err)
    if _stack_top(err, "_GEN", "_SELECT") is not None:  # `{{ gen 'name' }}`
        name = closed.group(0)[1:-1]
        bare = name if re.fullmatch(r"[A-Za-z_]\w*", name) else "name"
        return TemplateSyntaxError("a hole's name is a bare name, not a string",
                                   source.span_at(pos, end - pos), source,
                                   [f"write {{{{ {hole} {bare} }}}}"])
    expected = _accepted(err)
    notes = [*_expected_notes(expected, err), *_opener_note(err, source, pos)]
    if hole is not None and "NAME" in expected:
        notes.append(f"a hole's arguments are NAME=VALUE, e.g. stop={closed.group(0)}")
    return TemplateSyntaxError("unexpected string", source.span_at(pos, end - pos), source,
                               notes)


def _where_clause(word: Token, source: Source) -> TemplateSyntaxError:
    """`{{ gen x where len(x) < 10 }}`: LMQL's constraint clause, read as an argument name."""
    return TemplateSyntaxError(
        "'where' clauses are not supported: constraints are the hole's arguments",
        source.span_at(word.start_pos or 0, len(word)), source,
        ['e.g. {{ gen x regex="[0-9]+" max_tokens=10 stop="\\n" }} (also json=, grammar=)',
         'a choice among fixed strings is a select: {{ select x options=["a", "b"] }}'])


def _unexpected_end(err: UnexpectedToken, source: Source) -> TemplateSyntaxError:
    opener = _open_tag(err)
    expected = _expected_notes(_accepted(err), err)
    if opener is None:
        return TemplateSyntaxError("unexpected end of template", source.end_span(), source,
                                   expected)
    start = opener.start_pos or 0
    return TemplateSyntaxError(
        f"tag '{opener.value}' is never closed",
        source.span_at(start, len(opener.value)), source,
        [*expected, "the template ends inside this tag"],
    )


def _bad_block_tag(pos: int, tag_start: int, source: Source) -> TemplateSyntaxError:
    """The word after `{%` is not a tag keyword: unknown tag, unclosed raw, stray endraw."""
    word_match = re.compile(r"\w+").match(source.text, pos)
    word = word_match.group(0) if word_match else source.text[pos:pos + 1]
    span = source.span_at(tag_start, pos + len(word) - tag_start)
    if word == "raw":
        return TemplateSyntaxError("'{% raw %}' is never closed", span, source,
                                   ["expected '{% endraw %}' before the end of the template"])
    if word == "endraw":
        return TemplateSyntaxError("'{% endraw %}' without a matching '{% raw %}'", span,
                                   source)
    notes = ["expected one of: " + ", ".join(f"'{k}'" for k in BLOCK_KEYWORDS)]
    close = difflib.get_close_matches(word, BLOCK_KEYWORDS, n=1)
    if word in TAG_HINTS:
        notes.insert(0, TAG_HINTS[word])
    elif close:
        notes.insert(0, f"did you mean '{close[0]}'?")
    what = f"unknown tag '{word}'" if word_match else f"unexpected {_describe(source.text, pos)[0]}"
    return TemplateSyntaxError(what, span, source, notes)


def _test_note(text: str, pos: int) -> list[str]:
    """After `x is NAME`, an argument without parentheses (`is divisibleby 3`)."""
    match = _TEST_BEFORE.search(text, max(0, pos - 60), pos)
    if match is None:
        return []
    name = match.group(1)
    if name in TEST_HINTS:
        return [f"'{name}' is not a qrun test: {TEST_HINTS[name]}"]
    return [f"the test '{name}' takes no argument"]


def _accepted(err: UnexpectedInput) -> set[str]:
    """The terminals the parser could really accept here (after reductions), falling back to the
    state's lookahead set when Lark cannot tell."""
    interactive = getattr(err, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts())
        except Exception:  # noqa: BLE001 - best effort: the error itself must still be reported
            pass
    if isinstance(err, UnexpectedCharacters):
        return set(err.allowed or ())
    if isinstance(err, UnexpectedToken):
        return set(err.expected or ())
    return set()


def _expected_notes(expected: set[str], err: UnexpectedInput) -> list[str]:
    words = _readable(expected, err)
    if not words:
        return []
    if len(words) == 1:
        return [f"expected {words[0]}"]
    return ["expected one of: " + ", ".join(words)]


def _readable(expected: set[str], err: UnexpectedInput) -> list[str]:
    keys = {name: _terminal_key(name) for name in expected}
    present = set(keys.values())
    words: list[str] = []
    if {"NUMBER", "STRING"} <= present:
        words.append("an expression")
        keys = {n: k for n, k in keys.items() if k not in _EXPR_START}
    structural = {n: k for n, k in keys.items() if k not in _OPERATORS}
    if structural:
        keys = structural
    for name in sorted(keys, key=lambda n: keys[n]):
        word = _READABLE[name] if name in _READABLE else _terminal_text(keys[name], err)
        if word is not None and word not in words:
            words.append(word)
    return words


def _terminal_key(name: str) -> str:
    """The text a terminal stands for ('==', 'if', ...), or its name for regex terminals."""
    if name.startswith("_") and not name.startswith("__"):
        return name[1:].lower().replace("true", "True").replace("false", "False").replace(
            "none", "None")
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name
    return str(pattern.value) if isinstance(pattern, PatternStr) else name


def _terminal_text(key: str, err: UnexpectedInput) -> str:
    if key == "}":
        return "'}}'" if _closes_tag(err) else "'}'"
    return f"'{key}'"


def _closes_tag(err: UnexpectedInput) -> bool:
    """Whether a `}` here would start the tag's closing `}}` (rather than close a dict)."""
    interactive = getattr(err, "interactive_parser", None)
    if interactive is None:
        return True
    try:
        probe = interactive.copy()
        probe.feed_token(Token("RBRACE", "}"))
        return set(probe.accepts()) == {"RBRACE"}
    except Exception:  # noqa: BLE001 - best effort, as in _accepted
        return True


def _open_tag(err: UnexpectedInput) -> Token | None:
    """The innermost tag opener (`{{` or `{%`) on the parser's stack, if the parser is inside a
    tag (finished tags and text are below it on the stack)."""
    for value in reversed(_value_stack(err)):
        if isinstance(value, Token):
            if value.type in _OPENERS:
                return value
            if value.type in ("TEXT", "COMMENT", "RAW", "FRONT_MATTER"):
                return None
        elif isinstance(value, Tree) and value.data in ("var_tag", "block_tag"):
            return None
    return None


def _value_stack(err: UnexpectedInput) -> list[object]:
    """What the parser has shifted and reduced so far, innermost last."""
    interactive = getattr(err, "interactive_parser", None)
    return list(getattr(getattr(interactive, "parser_state", None), "value_stack", ()))


def _stack_top(err: UnexpectedInput, *types: str) -> Token | None:
    """The token the parser shifted last, when it is of one of `types`."""
    stack = _value_stack(err)
    top = stack[-1] if stack else None
    return top if isinstance(top, Token) and top.type in types else None


def _hole_kind(err: UnexpectedInput) -> str | None:
    """'gen' or 'select' when the parser is inside a hole's tag (after its keyword)."""
    for value in reversed(_value_stack(err)):
        if isinstance(value, Token) and value.type in ("_GEN", "_SELECT"):
            return "gen" if value.type == "_GEN" else "select"
        if isinstance(value, Token) and value.type in _OPENERS:
            return None  # the tag's keyword comes right after its opener
    return None


def _opener_note(err: UnexpectedInput, source: Source, pos: int) -> list[str]:
    opener = _open_tag(err)
    if opener is None or opener.start_pos is None:
        return []
    line, column = source.position(opener.start_pos)
    here, _ = source.position(pos)
    if here == line and not source.text.startswith(("{{", "{%"), pos):
        return []
    return [f"the tag '{opener.value}' opened at {line}:{column} is not closed"]


def _describe(text: str, pos: int) -> tuple[str, int]:
    """A short description of what is at `pos` and how many characters it covers."""
    if pos >= len(text):
        return "end of template", 0
    for tag in ("{{", "{%", "{#", "}}", "%}"):
        if text.startswith(tag, pos):
            return f"'{tag}'", 2
    word = re.compile(r"\w+").match(text, pos)
    if word is not None:
        return f"'{word.group(0)[:40]}'", len(word.group(0))
    if text[pos] == "\n":
        return "end of line", 1
    return f"{text[pos]!r}", 1

