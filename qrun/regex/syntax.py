"""The regex front end: pattern text -> a small AST with qrun's meaning already applied, read by
both back ends (dfa.py builds the automaton every token mask comes from, portable.py writes the
pattern for another engine). The only module that reads CPython's private regex parser.

Semantics (pinned by tests/constraints): a pattern matches exactly the str `s` with
`regex.fullmatch(pattern, s, flags=regex.ASCII)`, i.e.
- full match (not search), set semantics: lazy quantifiers (`*?`) mean the same as greedy ones;
- ASCII classes: `\\d` = [0-9], `\\w` = [A-Za-z0-9_], `\\s` = [ \\t\\n\\r\\f\\v]; `(?i)` folds
  ASCII letters only (what users mean for dates, ints and identifiers; docs/internals.md §3.3);
- `.` is any character but a newline (any character with `(?s)`); negated classes and non-ASCII
  literals range over the whole Unicode range, surrogates excluded;
- `^`/`\\A` match only at the start, `\\Z` only at the end, `$` at the end or before a final
  newline (Python's rule).
Constructs a finite automaton cannot express, or that qrun does not implement, raise
PatternError naming the construct. interegular (the front end the design started from,
docs/internals.md §3.5) was not used: it silently accepts lookahead at
the end of a pattern with the wrong meaning (`a(?=b)` accepts "ab"), has no `\\Z`/`$`/`\\A`,
and expands ranges such as `[\\x00-\\U0010FFFF]` into a set of every character."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from re import _constants as sre_c  # type: ignore[attr-defined, unused-ignore]
from re import _parser as sre_parse  # type: ignore[attr-defined, unused-ignore]
from typing import Any, Literal

import regex

from qrun.regex.charset import (
    DIGIT,
    NEWLINE,
    SPACE,
    WORD,
    Ranges,
    complement,
    fold_ascii,
    normalise,
)

MAX_SIZE = 100_000
"""A pattern may expand (bounded repeats unrolled) to at most this many items. Checked before
anything calls `regex.compile`, which expands `(?:x{65535}){65535}` until memory runs out; the
DFA compiler's own state caps only apply after that."""
MAX_DEPTH = 100
"""Groups and repeats nest at most this deep (the back ends recurse over the AST)."""


class PatternError(ValueError):
    """A regex is invalid or uses a construct a token mask cannot express. `pos` is the offset
    in the pattern where a syntax error was found, when known. The compiler wraps it into a
    ConstraintError with the template span."""

    def __init__(self, message: str, pos: int | None = None) -> None:
        super().__init__(message)
        self.pos = pos


# ---- the AST -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chars:
    """One character from `ranges` (case folding already applied; empty: matches nothing)."""

    ranges: Ranges


@dataclass(frozen=True, slots=True)
class Seq:
    """The items one after another (a nested Seq is never an item: groups are flattened)."""

    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    """Any one of the options."""

    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """`item` at least `low` and at most `high` times (None: unbounded)."""

    item: Node
    low: int
    high: int | None


@dataclass(frozen=True, slots=True)
class Anchor:
    """`start`: `^` or `\\A`; `end`: `\\Z`; `dollar`: `$` (the end, or before a final newline)."""

    kind: Literal["start", "end", "dollar"]


Node = Chars | Seq | Alt | Repeat | Anchor


def literal(data: str) -> Seq:
    """The AST of a regex matching exactly `data`."""
    return Seq(tuple(Chars(normalise([(ord(c), ord(c))])) for c in data))


# ---- parsing -------------------------------------------------------------------------------------


def parse(pattern: str) -> Node:
    """Parse `pattern` (Python `regex` syntax) into the AST, with qrun's semantics applied.

    Raises:
        PatternError: invalid syntax (with `pos`), a pattern too large or nested too deeply, or
            a construct with no token mask (backreference, lookaround, word boundary, atomic
            group, possessive quantifier, Unicode property, fuzzy matching, ...).
    """
    special = _regex_only_syntax(pattern)
    if special is not None:
        raise PatternError(special)
    try:
        with warnings.catch_warnings():
            # re warns about "possible nested set" ([[, --, && in classes); `regex` in its
            # default V0 mode reads those literally, as re does.
            warnings.simplefilter("ignore", FutureWarning)
            parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise _not_for_re(pattern, exc) from None
    except RecursionError:
        raise PatternError("invalid regex: pattern nested too deeply") from None
    except (OverflowError, ValueError) as exc:
        raise PatternError(f"invalid regex: {exc}") from None
    size = _size(parsed, 0)
    if size > MAX_SIZE:
        raise PatternError(f"invalid regex: pattern too large once repeats are expanded "
                           f"(~{size} items, at most {MAX_SIZE})")
    _check_reference_syntax(pattern)
    return _convert(parsed, int(parsed.state.flags))


def _not_for_re(pattern: str, exc: re.error) -> PatternError:
    """Python's parser refused `pattern`: invalid syntax, or `regex`-only syntax (\\p{L}, \\X)
    that qrun does not implement; `regex.compile` tells which, once the size is known safe."""
    if _rough_size(pattern) > MAX_SIZE:
        return PatternError("invalid regex: pattern too large once repeats are expanded "
                            f"(more than {MAX_SIZE} items)")
    try:
        regex.compile(pattern)
    except regex.error:  # invalid for both: Python's parser points at the fault more precisely
        return PatternError(f"invalid regex: {exc.msg}", exc.pos)
    except RecursionError:
        return PatternError("invalid regex: pattern nested too deeply")
    if re.search(r"\\[pP]\{|\\[pP][A-Za-z]", pattern):
        return PatternError(
            "Unicode properties (\\p{...}) are not supported; spell out the character class")
    if "\\X" in pattern:
        return PatternError("grapheme clusters (\\X) are not supported")
    return PatternError(f"unsupported regex construct ({exc.msg})", exc.pos)


def _check_reference_syntax(pattern: str) -> None:
    # `regex` is the reference syntax: a pattern Python's parser reads must also compile there.
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise PatternError(f"invalid regex: {exc.msg}", exc.pos) from None
    except RecursionError:
        raise PatternError("invalid regex: pattern nested too deeply") from None


_FUZZY = re.compile(r"[0-9eids<=+,\s]*[eids][0-9eids<=+,\s]*")


def _regex_only_syntax(pattern: str) -> str | None:
    """Find `regex`-module syntax that Python's parser would silently read differently: fuzzy
    constraints (`(?:abc){e<=1}`, literal braces to `re`) and POSIX classes (`[[:alpha:]]`, a
    nested-set warning to `re`)."""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
        elif char == "[":
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                if pattern[j] == "\\":
                    j += 1
                elif re.match(r"\[:\^?[A-Za-z]+:\]", pattern[j:]):
                    return "POSIX character classes ([[:alpha:]]) are not supported"
                j += 1
            i = j + 1
        elif char == "{":
            end = pattern.find("}", i)
            if end > 0 and _FUZZY.fullmatch(pattern[i + 1 : end]):
                return "fuzzy matching ({e<=n}) cannot be expressed as a token mask"
            i += 1
        else:
            i += 1
    return None


# ---- size bounds ---------------------------------------------------------------------------------

_REPEATS = {getattr(sre_c, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
            if hasattr(sre_c, name)}
_QUANTIFIER = re.compile(r"\{([0-9]*)(?:,([0-9]*))?\}")


def _size(items: Any, depth: int) -> int:
    """Items in a parsed pattern with bounded repeats unrolled; stops early past the limit."""
    if depth > MAX_DEPTH:
        raise PatternError("invalid regex: pattern nested too deeply")
    total = 0
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            count = max(low, 1) if high == sre_c.MAXREPEAT else max(high, 1)
            total += count * _size(sub, depth + 1)
        else:
            total += 1 + sum(_size(s, depth + 1) for s in _subpatterns(av))
        if total > MAX_SIZE:
            return total
    return total


def _subpatterns(value: Any) -> Iterator[Any]:
    if isinstance(value, sre_parse.SubPattern):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _subpatterns(item)


def _rough_size(pattern: str) -> int:
    """An upper bound on the expanded size of a pattern Python's parser rejects (`regex`-only
    syntax): its length times every `{m,n}` count, so nesting is always covered."""
    size = max(len(pattern), 1)
    for match in _QUANTIFIER.finditer(pattern):
        count = match.group(2) or match.group(1) or "0"
        if len(count) > 9:
            return MAX_SIZE + 1
        size *= max(int(count), 1)
        if size > MAX_SIZE:
            break
    return size


# ---- sre AST -> qrun AST -------------------------------------------------------------------------

_UNSUPPORTED_AT = {
    sre_c.AT_BOUNDARY: "word boundaries (\\b) cannot be expressed as a token mask",
    sre_c.AT_NON_BOUNDARY: "non-word boundaries (\\B) cannot be expressed as a token mask",
}
_ANCHORS: dict[Any, Literal["start", "end", "dollar"]] = {
    sre_c.AT_BEGINNING: "start", sre_c.AT_BEGINNING_STRING: "start",
    sre_c.AT_END_STRING: "end", sre_c.AT_END: "dollar",
}


def _convert(items: Sequence[tuple[Any, Any]], flags: int) -> Node:
    nodes: list[Node] = []
    for op, av in items:
        node = _node(op, av, flags)
        nodes.extend(node.items if isinstance(node, Seq) else (node,))
    return nodes[0] if len(nodes) == 1 else Seq(tuple(nodes))


def _node(op: Any, av: Any, flags: int) -> Node:
    message = _unsupported(op, av)
    if message is not None:
        raise PatternError(message)
    ignore_case = bool(flags & sre_c.SRE_FLAG_IGNORECASE)
    if op is sre_c.LITERAL:
        return Chars(_fold(normalise([(av, av)]), ignore_case))
    if op is sre_c.NOT_LITERAL:
        return Chars(complement(_fold(normalise([(av, av)]), ignore_case)))
    if op is sre_c.ANY:
        dotall = bool(flags & sre_c.SRE_FLAG_DOTALL)
        return Chars(complement(() if dotall else ((NEWLINE, NEWLINE),)))
    if op is sre_c.IN:
        return Chars(_class_ranges(av, ignore_case))
    if op is sre_c.BRANCH:
        return Alt(tuple(_convert(option, flags) for option in av[1]))
    if op is sre_c.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        return _convert(sub, (flags | add_flags) & ~del_flags)
    if op is sre_c.MAX_REPEAT or op is sre_c.MIN_REPEAT:  # lazy = greedy (set semantics)
        low, high, sub = av
        return Repeat(_convert(sub, flags), low, None if high == sre_c.MAXREPEAT else high)
    if op is sre_c.AT:
        return _anchor(av, flags)
    raise PatternError(f"unsupported regex construct {op}")


def _anchor(code: Any, flags: int) -> Anchor:
    if code in _UNSUPPORTED_AT:
        raise PatternError(_UNSUPPORTED_AT[code])
    if flags & sre_c.SRE_FLAG_MULTILINE and code in (sre_c.AT_BEGINNING, sre_c.AT_END):
        raise PatternError("multiline anchors ((?m) with ^ or $) are not supported")
    if code not in _ANCHORS:
        raise PatternError(f"unsupported anchor {code}")
    return Anchor(_ANCHORS[code])


def _unsupported(op: Any, av: Any) -> str | None:
    """The message for a construct qrun refuses, or None."""
    if op is sre_c.GROUPREF_EXISTS:
        return "conditional groups ((?(1)...)) cannot be expressed as a token mask"
    if op is sre_c.GROUPREF:
        return "backreferences (\\1, (?P=name)) cannot be expressed as a token mask"
    if op is sre_c.ASSERT or op is sre_c.ASSERT_NOT:
        direction = "lookahead" if av[0] == 1 else "lookbehind"
        syntax = {"lookahead": "(?=...)", "lookbehind": "(?<=...)"}[direction]
        if op is sre_c.ASSERT_NOT:
            return f"negative {direction} {syntax.replace('=', '!')} cannot be expressed as a " \
                   "token mask"
        return f"{direction} {syntax} cannot be expressed as a token mask"
    if op is getattr(sre_c, "ATOMIC_GROUP", None):
        return "atomic groups (?>...) are not supported"
    if op is getattr(sre_c, "POSSESSIVE_REPEAT", None):
        return "possessive quantifiers (*+, ++, ?+, {m,n}+) are not supported"
    return None


def _fold(ranges: Ranges, ignore_case: bool) -> Ranges:
    return fold_ascii(ranges) if ignore_case else ranges


def _class_ranges(items: Sequence[tuple[Any, Any]], ignore_case: bool) -> Ranges:
    """The codepoint ranges of a class's items ([(LITERAL, c), (RANGE, (a, b)), (CATEGORY, ...),
    NEGATE?]), ASCII letters folded with `ignore_case` before a negation applies."""
    negate = False
    ranges: list[tuple[int, int]] = []
    for op, av in items:
        if op is sre_c.NEGATE:
            negate = True
        elif op is sre_c.LITERAL:
            ranges.append((av, av))
        elif op is sre_c.RANGE:
            ranges.append(av)
        elif op is sre_c.CATEGORY:
            ranges.extend(_category(av))
        elif op is sre_c.NOT_LITERAL:
            ranges.extend(complement(((av, av),)))
        else:
            raise PatternError(f"unsupported item in character class: {op}")
    folded = _fold(normalise(ranges), ignore_case)
    return complement(folded) if negate else folded


def _category(code: Any) -> Ranges:
    """ASCII meaning of \\d \\w \\s and their negations (see the module docstring)."""
    table: dict[Any, tuple[Ranges, bool]] = {
        sre_c.CATEGORY_DIGIT: (DIGIT, False),
        sre_c.CATEGORY_NOT_DIGIT: (DIGIT, True),
        sre_c.CATEGORY_WORD: (WORD, False),
        sre_c.CATEGORY_NOT_WORD: (WORD, True),
        sre_c.CATEGORY_SPACE: (SPACE, False),
        sre_c.CATEGORY_NOT_SPACE: (SPACE, True),
    }
    if code not in table:
        raise PatternError(f"unsupported character category {code}")
    ranges, negated = table[code]
    return complement(ranges) if negated else ranges
