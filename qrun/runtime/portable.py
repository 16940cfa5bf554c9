"""A qrun regex rewritten for another engine's regex dialect (vLLM's structured outputs:
xgrammar, llguidance): the same language as qrun's own DFA (runtime/dfa.py), with every
meaning qrun fixes made explicit, so the server cannot read it differently: ASCII `\\d\\w\\s`
as character classes, `(?i)` folded into classes, `.` as "anything but a newline", lazy
quantifiers as greedy ones (set semantics), and the only anchors qrun allows at the edges
(`^`/`\\A` first, `\\Z`/`$` last) turned into plain text."""

from __future__ import annotations

import functools
from re import _constants as sre_c  # type: ignore[attr-defined, unused-ignore]
from typing import Any

from qrun.runtime.dfa import (
    PatternError,
    _complement,
    _fold_ascii,
    _normalise,
    _parse,
    _unsupported,
    class_ranges,
)

Ranges = tuple[tuple[int, int], ...]

# Characters that mean something in a regex (outside or inside a class), always escaped.
_META = set(r"\.^$|?*+()[]{}-/&~#")
_NEWLINE_ONLY: Ranges = ((0x0A, 0x0A),)


class PortableError(PatternError):
    """A pattern qrun accepts that has no faithful rewrite for the server (an anchor inside
    the pattern)."""


# A server run rewrites each hole's pattern once before the run (the portability check) and
# again at the hole, for every run of a batch: the rewrite is pure, so it is kept, as the DFA
# is (dfa.compile_dfa).
@functools.lru_cache(maxsize=256)
def portable_regex(pattern: str) -> str:
    """`pattern` rewritten with qrun's meaning explicit (see the module docstring).

    Raises:
        PatternError: the pattern is invalid or unsupported (as for a token mask).
        PortableError: it uses an anchor away from its edges.
    """
    ast, flags = _parse(pattern)
    nodes = list(ast)
    tail = ""
    if nodes and nodes[0][0] is sre_c.AT and nodes[0][1] in (
            sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING):
        nodes = nodes[1:]
    if nodes and nodes[-1][0] is sre_c.AT:
        if nodes[-1][1] is sre_c.AT_END_STRING:
            nodes = nodes[:-1]
        elif nodes[-1][1] is sre_c.AT_END:
            nodes, tail = nodes[:-1], "(?:\\n)?"  # Python's $: the end, or before a last \n
    return _sequence(nodes, flags) + tail


def escape(text: str) -> str:
    """A regex matching exactly `text`."""
    return "".join(_char(ord(c)) for c in text)


def _sequence(nodes: Any, flags: int) -> str:
    return "".join(_node(op, av, flags) for op, av in nodes)


def _node(op: Any, av: Any, flags: int) -> str:
    message = _unsupported(op, av)
    if message is not None:
        raise PatternError(message)
    ignore_case = bool(flags & sre_c.SRE_FLAG_IGNORECASE)
    if op is sre_c.LITERAL:
        ranges = _normalise([(av, av)])
        return _class(_fold_ascii(ranges) if ignore_case else ranges)
    if op is sre_c.NOT_LITERAL:
        ranges = _normalise([(av, av)])
        return _class(_complement(_fold_ascii(ranges) if ignore_case else ranges))
    if op is sre_c.ANY:
        return _class(_complement(() if flags & sre_c.SRE_FLAG_DOTALL else _NEWLINE_ONLY))
    if op is sre_c.IN:
        return _class(class_ranges(av, ignore_case))
    if op is sre_c.BRANCH:
        return "(?:" + "|".join(_sequence(option, flags) for option in av[1]) + ")"
    if op is sre_c.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        return "(?:" + _sequence(sub, (flags | add_flags) & ~del_flags) + ")"
    if op is sre_c.MAX_REPEAT or op is sre_c.MIN_REPEAT:
        low, high, sub = av
        body = "(?:" + _sequence(sub, flags) + ")"
        if high == sre_c.MAXREPEAT:
            return body + ("*" if low == 0 else "+" if low == 1 else f"{{{low},}}")
        return body + (f"{{{low}}}" if low == high else f"{{{low},{high}}}")
    if op is sre_c.AT:
        raise PortableError("an anchor (^, $, \\A, \\Z) inside the pattern has no equivalent "
                            "in the server's regex dialect; anchors may only begin or end it")
    raise PatternError(f"unsupported regex construct {op}")


def _class(ranges: Ranges) -> str:
    """A character class for codepoint ranges; a lone character as itself. A set closer to
    "everything" is written as a negated class of what it leaves out."""
    if not ranges:
        return "[^\\x00-\\U0010FFFF]"  # matches nothing (an empty class)
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _char(ranges[0][0])
    left_out = _complement(ranges)
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
