"""A qrun regex rewritten for another engine's regex dialect (vLLM's structured outputs:
xgrammar, llguidance): the same language as qrun's own DFA (dfa.py), written from the same AST
(syntax.py) with every meaning qrun fixes made explicit, so the server cannot read it
differently: ASCII `\\d\\w\\s` as character classes, `(?i)` folded into classes, `.` as
"anything but a newline", lazy quantifiers as greedy ones (set semantics), and the only anchors
qrun allows at the edges (`^`/`\\A` first, `\\Z`/`$` last) turned into plain text."""

from __future__ import annotations

import functools

from qrun.regex.charset import Ranges, complement
from qrun.regex.syntax import Alt, Anchor, Chars, Node, PatternError, Repeat, Seq, parse

# Characters that mean something in a regex (outside or inside a class), always escaped.
_META = set(r"\.^$|?*+()[]{}-/&~#")


class PortableError(PatternError):
    """A pattern qrun accepts that has no faithful rewrite for the server (an anchor inside
    the pattern)."""


# A server run rewrites each hole's pattern once before the run (the portability check) and
# again at the hole, for every run of a batch: the rewrite is pure, so it is kept, as the DFA
# is (dfa.compile_dfa).
@functools.lru_cache(maxsize=256)
def portable_regex(pattern: str, prefix: str = "", follow: str = "") -> str:
    """`pattern` rewritten with qrun's meaning explicit (see the module docstring), after the
    literal text `prefix` when one is given (the healed text), and optionally followed by any
    beginning of the literal text `follow` (the text after a hole, which may end it).

    Raises:
        PatternError: the pattern is invalid or unsupported (as for a token mask).
        PortableError: it uses an anchor away from its edges.
    """
    node = parse(pattern)
    items = list(node.items) if isinstance(node, Seq) else [node]
    tail = ""
    if items and items[0] == Anchor("start"):
        items = items[1:]
    if items and items[-1] == Anchor("end"):
        items = items[:-1]
    elif items and items[-1] == Anchor("dollar"):
        items, tail = items[:-1], "(?:\\n)?"  # Python's $: the end, or before a last \n
    body = "".join(_node(item) for item in items) + tail
    if follow:
        body = "(?:" + body + ")" + _optional_prefixes(follow)
    return escape(prefix) + ("(?:" + body + ")" if prefix else body)


def _optional_prefixes(text: str) -> str:
    """A regex matching any beginning of `text`, the empty one included."""
    return "".join("(?:" + _char(ord(c)) for c in text) + ")?" * len(text)


def escape(text: str) -> str:
    """A regex matching exactly `text`."""
    return "".join(_char(ord(c)) for c in text)


def _node(node: Node) -> str:
    match node:
        case Chars(ranges=ranges):
            return _class(ranges)
        case Seq(items=items):
            return "(?:" + "".join(_node(item) for item in items) + ")"
        case Alt(options=options):
            return "(?:" + "|".join(_node(option) for option in options) + ")"
        case Repeat(item=item, low=low, high=high):
            body = "(?:" + _node(item) + ")"
            if high is None:
                return body + ("*" if low == 0 else "+" if low == 1 else f"{{{low},}}")
            return body + (f"{{{low}}}" if low == high else f"{{{low},{high}}}")
        case Anchor():
            raise PortableError("an anchor (^, $, \\A, \\Z) inside the pattern has no "
                                "equivalent in the server's regex dialect; anchors may only "
                                "begin or end it")


def _class(ranges: Ranges) -> str:
    """A character class for codepoint ranges; a lone character as itself. A set closer to
    "everything" is written as a negated class of what it leaves out."""
    if not ranges:
        return "[^\\x00-\\U0010FFFF]"  # matches nothing (an empty class)
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _char(ranges[0][0])
    left_out = complement(ranges)
    if not left_out:
        return "[\\s\\S]"  # every character
    if len(left_out) < len(ranges):
        return "[^" + "".join(_span(lo, hi) for lo, hi in left_out) + "]"
    return "[" + "".join(_span(lo, hi) for lo, hi in ranges) + "]"


def _span(lo: int, hi: int) -> str:
    if lo == hi:
        return _char(lo)
    return _char(lo) + ("-" if hi > lo + 1 else "") + _char(hi)


def _char(code: int) -> str:
    if code < 0x80:
        char = chr(code)
        if char in _META:
            return "\\" + char
        if char.isprintable() and char != " ":
            return char
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
