"""Regex -> byte-level DFA: the automaton every token mask is computed from (masks.py walks
the vocabulary through `ByteDFA.transitions`). Own front end: Python's `sre_parse` AST ->
Thompson NFA over UTF-8 byte ranges -> subset construction over byte classes -> co-reachable,
minimised DFA.

Semantics (pinned by tests/constraints): the language of `compile_dfa(p)` is exactly the set of
UTF-8 encodings of the str `s` with `regex.fullmatch(p, s, flags=regex.ASCII)`, i.e.
- full match (not search), set semantics: lazy quantifiers (`*?`) mean the same as greedy ones;
- ASCII classes: `\\d` = [0-9], `\\w` = [A-Za-z0-9_], `\\s` = [ \\t\\n\\r\\f\\v]; `(?i)` folds
  ASCII letters only (what users mean for dates, ints and identifiers; docs/internals.md §3.3);
- `.`, negated classes and non-ASCII literals expand to UTF-8 byte sequences over the whole
  Unicode range (surrogates excluded), so tokens that split a character are judged correctly;
- `^`/`\\A` match only at the start, `\\Z` only at the end, `$` at the end or before a final
  newline (Python's rule).
Constructs that a finite automaton cannot express, or that we do not implement, raise
`PatternError` naming the construct.

interegular (the front end the design started from, docs/internals.md §3.5) was not used: it
silently accepts lookahead at the end of a pattern with the wrong meaning (`a(?=b)` accepts
"ab"), has no `\\Z`/`$`/`\\A`, and expands ranges such as `[\\x00-\\U0010FFFF]` into a set of
every character.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import regex

# `sre_parse` moved to `re._parser` in 3.11 and importing the old name warns there.
try:
    from re import _constants as sre_c  # type: ignore[attr-defined, unused-ignore]
    from re import _parser as sre_parse  # type: ignore[attr-defined, unused-ignore]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre_c  # type: ignore[no-redef, unused-ignore]
    import sre_parse  # type: ignore[no-redef, unused-ignore]

__all__ = [
    "DFA_MAX_STATES",
    "NFA_MAX_STATES",
    "ByteDFA",
    "PatternError",
    "compile_dfa",
    "UNREACHABLE",
    "distances_to_accept",
    "edge_distances",
]

# Subset construction stops here: masks are memoised per state and a 20k-state DFA already
# means ~1 GB of bool masks if all were visited. Real constraints are far smaller (a 7-field
# JSON schema with an email field: 829 states, docs/internals.md §3.7).
DFA_MAX_STATES = 20_000
# Bounded repeats are unrolled (`\d{1,5000}` makes 5000 copies); this caps that blow-up before
# subset construction starts.
NFA_MAX_STATES = 200_000

_MAX_CODEPOINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
# ASCII classes (see module docstring); inclusive codepoint ranges.
_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_NEWLINE = 0x0A

# Modes of an NFA state inside a DFA state (encoded as nfa_state * 3 + mode): NORMAL may read
# any byte; ENDED sits after `\Z`/`$` and may read nothing; NL_PENDING sits after `$` when the
# rest of the input is exactly "\n" (Python's `$` also matches before a final newline).
_NORMAL, _ENDED, _NL_PENDING = 0, 1, 2

Ranges = tuple[tuple[int, int], ...]


class PatternError(ValueError):
    """A regex is invalid or uses a construct a token mask cannot express. The compiler wraps it
    into a ConstraintError with the template span."""


# ---------------------------------------------------------------------------------------------
# The DFA


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class ByteDFA:
    """A complete, minimal DFA over bytes.

    transitions: int32 [S+1, 256]; row S (== `dead`) is the dead state and maps to itself.
        Every state 0..S-1 is reachable from `start` and can reach acceptance (co-reachability),
        so "next state != dead" means "the input so far is a prefix of some match".
    accepting: bool [S+1]; accepting[dead] is False.
    dist: int32 [S+1], fewest bytes from each state to acceptance (dead: a huge value).
    All arrays are read-only.
    """

    pattern: str
    transitions: npt.NDArray[np.int32]
    accepting: npt.NDArray[np.bool_]
    start: int
    dist: npt.NDArray[np.int32]
    # Per state: the only live out-byte, or -1 when there are zero or several (precomputed for
    # forced_bytes, which fast-forward calls at every step).
    _single_byte: npt.NDArray[np.int16]

    def __repr__(self) -> str:
        return f"ByteDFA(pattern={self.pattern!r}, states={self.num_states})"

    @property
    def dead(self) -> int:
        return int(self.transitions.shape[0]) - 1

    @property
    def num_states(self) -> int:
        """Live states, not counting the dead state."""
        return self.dead

    def step(self, state: int, data: bytes) -> int:
        """The state after reading `data` from `state` (`dead` once no match is possible)."""
        table = self.transitions
        for byte in data:
            state = int(table[state, byte])
        return state

    def matches(self, data: bytes) -> bool:
        """Whether `data` is in the language (full match)."""
        return bool(self.accepting[self.step(self.start, data)])

    def dist_to_accept(self, state: int) -> int:
        """Fewest bytes that take `state` to an accepting state (0 when accepting)."""
        return int(self.dist[state])

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every match must continue with from `state`: follow the chain while the state
        is not accepting and has exactly one live out-byte (docs/internals.md §6.1)."""
        out = bytearray()
        single = self._single_byte
        while not self.accepting[state] and single[state] >= 0 and len(out) <= self.dead:
            byte = int(single[state])
            out.append(byte)
            state = int(self.transitions[state, byte])
        return bytes(out)


# Compiling is pure and ByteDFA immutable, so results are shared process-wide: the compiler
# checks a literal pattern and the runtime builds its token index from the same DFA. Long
# bounded repeats make minimisation cost seconds (x{5000}: ~5 s), so paying once matters.
@functools.lru_cache(maxsize=256)
def compile_dfa(pattern: str) -> ByteDFA:
    """Compile a regex (Python `regex` syntax, full-match, ASCII classes) to a byte DFA.

    Raises:
        PatternError: invalid syntax, a construct with no DFA (backreference, lookaround, word
            boundary, atomic group, possessive quantifier, Unicode property, ...), an empty
            language, or more than DFA_MAX_STATES / NFA_MAX_STATES states.
    """
    ast, flags = _parse(pattern)
    nfa = _Nfa()
    start, final = nfa.build(ast, flags)
    by_class, class_of, accepting = _determinize(nfa, start, final)
    by_class, accepting, dfa_start = _prune_and_minimise(by_class, accepting, 0)
    if by_class.shape[0] == 1:
        raise PatternError(f"regex {pattern!r} matches nothing")
    table = np.ascontiguousarray(by_class[:, class_of])
    dead = table.shape[0] - 1
    dist = distances_to_accept(table, accepting, np.ones(256, dtype=np.bool_))
    live = table != dead
    counts = live.sum(axis=1)
    single = np.where(counts == 1, live.argmax(axis=1), -1).astype(np.int16)
    for array in (table, accepting, dist, single):
        array.flags.writeable = False
    return ByteDFA(pattern, table, accepting, dfa_start, dist, single)


def distances_to_accept(
    table: npt.NDArray[np.int32], accepting: npt.NDArray[np.bool_], usable: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int32]:
    """Fewest transitions from each state to acceptance using only the columns (bytes, or byte
    classes) marked `usable`. Unreachable states (and dead) get UNREACHABLE."""
    n = table.shape[0]
    sub = table[:, usable]
    src = np.repeat(np.arange(n, dtype=np.int64), sub.shape[1])
    return edge_distances(n, src, sub.reshape(-1).astype(np.int64), accepting)


UNREACHABLE = np.iinfo(np.int32).max // 2


def edge_distances(
    n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], accepting: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int32]:
    """Fewest edges from each of `n` states to an accepting one, for the graph with edges
    src[i] -> dst[i] (BFS on the reversed graph). Unreachable: UNREACHABLE."""
    dist = np.full(n, UNREACHABLE, dtype=np.int32)
    pairs = np.unique(dst * n + src)
    order_dst, order_src = pairs // n, pairs % n
    starts = np.searchsorted(order_dst, np.arange(n + 1))
    queue = deque(int(s) for s in np.flatnonzero(accepting))
    dist[list(queue)] = 0
    while queue:
        state = queue.popleft()
        for pred in order_src[starts[state] : starts[state + 1]]:
            if dist[pred] == UNREACHABLE:
                dist[pred] = dist[state] + 1
                queue.append(int(pred))
    return dist


# ---------------------------------------------------------------------------------------------
# Front end: regex text -> sre_parse AST


def _parse(pattern: str) -> tuple[Any, int]:
    """Validate with the `regex` package (the reference syntax), then parse with sre_parse."""
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise PatternError(f"invalid regex {pattern!r}: {exc}") from None
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
        raise PatternError(_explain_regex_only(pattern, str(exc))) from None
    return parsed, int(parsed.state.flags)


_FUZZY = re.compile(r"[0-9eids<=+,\s]*[eids][0-9eids<=+,\s]*")


def _regex_only_syntax(pattern: str) -> str | None:
    """Find `regex`-module syntax that Python's `re` parser would silently read differently:
    fuzzy constraints (`(?:abc){e<=1}`, literal braces to `re`) and POSIX classes
    (`[[:alpha:]]`, a nested-set warning to `re`)."""
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


def _explain_regex_only(pattern: str, message: str) -> str:
    """Name the `regex`-module extension that Python's `re` parser rejected."""
    if re.search(r"\\[pP]\{|\\[pP][A-Za-z]", pattern):
        return "Unicode properties (\\p{...}) are not supported; spell out the character class"
    if "\\X" in pattern:
        return "grapheme clusters (\\X) are not supported"
    return f"unsupported regex construct in {pattern!r} ({message})"


_UNSUPPORTED_AT = {
    sre_c.AT_BOUNDARY: "word boundaries (\\b) cannot be expressed as a token mask",
    sre_c.AT_NON_BOUNDARY: "non-word boundaries (\\B) cannot be expressed as a token mask",
}


def _unsupported(op: Any, av: Any) -> str | None:
    """The message for an AST node we refuse, or None."""
    if op is sre_c.GROUPREF or op is sre_c.GROUPREF_EXISTS:
        if op is sre_c.GROUPREF_EXISTS:
            return "conditional groups ((?(1)...)) cannot be expressed as a token mask"
        return "backreferences (\\1, (?P=name)) cannot be expressed as a token mask"
    if op is sre_c.ASSERT or op is sre_c.ASSERT_NOT:
        direction = "lookahead" if av[0] == 1 else "lookbehind"
        sign = "" if op is sre_c.ASSERT else "negative "
        syntax = {"lookahead": "(?=...)", "lookbehind": "(?<=...)"}[direction]
        if sign:
            syntax = syntax.replace("=", "!")
        return f"{sign}{direction} {syntax} cannot be expressed as a token mask"
    if op is getattr(sre_c, "ATOMIC_GROUP", None):
        return "atomic groups (?>...) are not supported"
    if op is getattr(sre_c, "POSSESSIVE_REPEAT", None):
        return "possessive quantifiers (*+, ++, ?+, {m,n}+) are not supported"
    return None


# ---------------------------------------------------------------------------------------------
# Character sets (inclusive codepoint ranges) and their UTF-8 byte sequences


def _normalise(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sort, merge, and drop surrogates (they have no UTF-8 encoding)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    result: list[tuple[int, int]] = []
    s_lo, s_hi = _SURROGATES
    for lo, hi in out:
        if lo < s_lo:
            result.append((lo, min(hi, s_lo - 1)))
        if hi > s_hi:
            result.append((max(lo, s_hi + 1), hi))
    return tuple(result)


def _complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _MAX_CODEPOINT:
        out.append((nxt, _MAX_CODEPOINT))
    return _normalise(out)


def _fold_ascii(ranges: Ranges) -> Ranges:
    """(?i) under ASCII semantics: add the other case of every ASCII letter in the set."""
    extra: list[tuple[int, int]] = []
    for lo, hi in ranges:
        for a, b, delta in ((0x41, 0x5A, 32), (0x61, 0x7A, -32)):
            x, y = max(lo, a), min(hi, b)
            if x <= y:
                extra.append((x + delta, y + delta))
    return _normalise((*ranges, *extra))


def _utf8_sequences(lo: int, hi: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Split a surrogate-free codepoint range into sequences of byte ranges whose concatenation
    is exactly its UTF-8 encodings (the algorithm of Rust's regex-syntax `Utf8Sequences`)."""
    for boundary in (0x7F, 0x7FF, 0xFFFF):
        if lo <= boundary < hi:
            yield from _utf8_sequences(lo, boundary)
            yield from _utf8_sequences(boundary + 1, hi)
            return
    if hi <= 0x7F:
        yield ((lo, hi),)
        return
    for i in (1, 2, 3):
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask:
                yield from _utf8_sequences(lo, lo | mask)
                yield from _utf8_sequences((lo | mask) + 1, hi)
                return
            if hi & mask != mask:
                yield from _utf8_sequences(lo, (hi & ~mask) - 1)
                yield from _utf8_sequences(hi & ~mask, hi)
                return
    yield tuple(zip(chr(lo).encode(), chr(hi).encode(), strict=True))


# ---------------------------------------------------------------------------------------------
# Thompson NFA over byte ranges


class _Nfa:
    """Mutable NFA under construction (private to compile_dfa). States are ints; `edges[s]` holds
    (lo, hi, target) byte ranges, `eps[s]` plain epsilon moves, `begin[s]` epsilon moves valid
    only before any byte was read (`^`, `\\A`), `end[s]`/`dollar[s]` epsilon moves into ENDED
    mode (`\\Z`) or into ENDED-or-NL_PENDING mode (`$`)."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.begin: list[list[int]] = []
        self.end: list[list[int]] = []
        self.dollar: list[list[int]] = []

    def new(self) -> int:
        if len(self.edges) >= NFA_MAX_STATES:
            raise PatternError(
                f"regex is too large (more than {NFA_MAX_STATES} NFA states); "
                "reduce bounded repeat counts such as {1,5000}"
            )
        for table in (self.edges, self.eps, self.begin, self.end, self.dollar):
            table.append([])
        return len(self.edges) - 1

    def build(self, ast: Sequence[tuple[Any, Any]], flags: int) -> tuple[int, int]:
        """A fragment (entry, exit) for a sequence of AST nodes."""
        start = cur = self.new()
        for op, av in ast:
            entry, exit_ = self._node(op, av, flags)
            self.eps[cur].append(entry)
            cur = exit_
        return start, cur

    def _node(self, op: Any, av: Any, flags: int) -> tuple[int, int]:
        message = _unsupported(op, av)
        if message is not None:
            raise PatternError(message)
        if op is sre_c.LITERAL:
            return self._charset(_normalise([(av, av)]), flags)
        if op is sre_c.NOT_LITERAL:
            return self._charset(_complement(self._fold(_normalise([(av, av)]), flags)), 0)
        if op is sre_c.ANY:
            if flags & sre_c.SRE_FLAG_DOTALL:
                return self._charset(_complement(()), 0)
            return self._charset(_complement(((_NEWLINE, _NEWLINE),)), 0)
        if op is sre_c.IN:
            return self._charset(self._class(av, flags), 0)
        if op is sre_c.BRANCH:
            return self._branch(av[1], flags)
        if op is sre_c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            return self.build(sub, (flags | add_flags) & ~del_flags)
        if op is sre_c.MAX_REPEAT or op is sre_c.MIN_REPEAT:
            return self._repeat(av, flags)
        if op is sre_c.AT:
            return self._anchor(av, flags)
        raise PatternError(f"unsupported regex construct {op}")

    def _fold(self, ranges: Ranges, flags: int) -> Ranges:
        return _fold_ascii(ranges) if flags & sre_c.SRE_FLAG_IGNORECASE else ranges

    def _class(self, items: Sequence[tuple[Any, Any]], flags: int) -> Ranges:
        return class_ranges(items, bool(flags & sre_c.SRE_FLAG_IGNORECASE))

    def _charset(self, ranges: Ranges, flags: int) -> tuple[int, int]:
        ranges = self._fold(ranges, flags)
        start, end = self.new(), self.new()
        for lo, hi in ranges:
            for seq in _utf8_sequences(lo, hi):
                cur = start
                for i, (b_lo, b_hi) in enumerate(seq):
                    nxt = end if i == len(seq) - 1 else self.new()
                    self.edges[cur].append((b_lo, b_hi, nxt))
                    cur = nxt
        return start, end

    def _branch(self, options: Sequence[Any], flags: int) -> tuple[int, int]:
        start, end = self.new(), self.new()
        for option in options:
            entry, exit_ = self.build(option, flags)
            self.eps[start].append(entry)
            self.eps[exit_].append(end)
        return start, end

    def _repeat(self, av: Any, flags: int) -> tuple[int, int]:
        low, high, sub = av
        start = cur = self.new()
        for _ in range(low):
            entry, exit_ = self.build(sub, flags)
            self.eps[cur].append(entry)
            cur = exit_
        if high == sre_c.MAXREPEAT:
            entry, exit_ = self.build(sub, flags)
            loop = self.new()
            self.eps[cur].append(loop)
            self.eps[loop].append(entry)
            self.eps[exit_].append(loop)
            return start, loop
        end = self.new()
        for _ in range(high - low):
            # Each optional copy may be skipped straight to the end: a(a(a)?)? shape.
            self.eps[cur].append(end)
            entry, exit_ = self.build(sub, flags)
            self.eps[cur].append(entry)
            cur = exit_
        self.eps[cur].append(end)
        return start, end

    def _anchor(self, code: Any, flags: int) -> tuple[int, int]:
        if code in _UNSUPPORTED_AT:
            raise PatternError(_UNSUPPORTED_AT[code])
        if flags & sre_c.SRE_FLAG_MULTILINE and code in (sre_c.AT_BEGINNING, sre_c.AT_END):
            raise PatternError("multiline anchors ((?m) with ^ or $) are not supported")
        start, end = self.new(), self.new()
        if code in (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING):
            self.begin[start].append(end)
        elif code is sre_c.AT_END_STRING:
            self.end[start].append(end)
        elif code is sre_c.AT_END:
            self.dollar[start].append(end)
        else:
            raise PatternError(f"unsupported anchor {code}")
        return start, end


def class_ranges(items: Sequence[tuple[Any, Any]], ignore_case: bool) -> Ranges:
    """The codepoint ranges of an `IN` node's items ([(LITERAL, c), (RANGE, (a, b)),
    (CATEGORY, ...), NEGATE?]), ASCII letters folded with `ignore_case`."""
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
            ranges.extend(_complement(((av, av),)))
        else:
            raise PatternError(f"unsupported item in character class: {op}")
    folded = _normalise(ranges)
    folded = _fold_ascii(folded) if ignore_case else folded
    return _complement(folded) if negate else folded


def _category(code: Any) -> Ranges:
    """ASCII meaning of \\d \\w \\s and their negations (see module docstring)."""
    table: dict[Any, tuple[Ranges, bool]] = {
        sre_c.CATEGORY_DIGIT: (_DIGIT, False),
        sre_c.CATEGORY_NOT_DIGIT: (_DIGIT, True),
        sre_c.CATEGORY_WORD: (_WORD, False),
        sre_c.CATEGORY_NOT_WORD: (_WORD, True),
        sre_c.CATEGORY_SPACE: (_SPACE, False),
        sre_c.CATEGORY_NOT_SPACE: (_SPACE, True),
    }
    if code not in table:
        raise PatternError(f"unsupported character category {code}")
    ranges, negated = table[code]
    return _complement(ranges) if negated else ranges


# ---------------------------------------------------------------------------------------------
# Subset construction over byte classes


def _determinize(
    nfa: _Nfa, start: int, final: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """Powerset construction over byte classes (maximal byte ranges no NFA edge tells apart).
    Returns the [S+1, n_classes] table (last row dead, start 0), the class of each byte, and
    the accepting flags."""
    bounds = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            bounds.update((lo, hi + 1))
    cuts = sorted(bounds)
    class_of = np.zeros(256, dtype=np.intp)
    for index, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        class_of[a:b] = index
    n_classes = len(cuts) - 1
    class_edges = [
        [(int(class_of[lo]), int(class_of[hi]), t) for lo, hi, t in edges] for edges in nfa.edges
    ]
    closures = _Closures(nfa)
    newline_class = int(class_of[_NEWLINE])

    first = closures.of([start * 3 + _NORMAL], at_start=True)
    ids: dict[frozenset[int], int] = {first: 0}
    order = [first]
    rows: list[list[int]] = []
    accepting: list[bool] = []
    finals = {final * 3 + _ENDED, final * 3 + _NORMAL}
    for current in order:  # `order` grows while we iterate: a BFS over DFA states
        targets: list[set[int]] = [set() for _ in range(n_classes)]
        for code in current:
            state, mode = divmod(code, 3)
            if mode == _ENDED:
                continue
            for c_lo, c_hi, target in class_edges[state]:
                if mode == _NL_PENDING:
                    if c_lo <= newline_class <= c_hi:
                        targets[newline_class].add(target * 3 + _ENDED)
                    continue
                for cls in range(c_lo, c_hi + 1):
                    targets[cls].add(target * 3 + _NORMAL)
        row = []
        for seed in targets:
            if not seed:
                row.append(-1)
                continue
            closed = closures.of(seed, at_start=False)
            if closed not in ids:
                if len(order) >= DFA_MAX_STATES:
                    raise PatternError(
                        f"regex needs more than {DFA_MAX_STATES} DFA states; simplify it "
                        "(fewer alternatives, smaller bounded repeats)"
                    )
                ids[closed] = len(order)
                order.append(closed)
            row.append(ids[closed])
        rows.append(row)
        accepting.append(not finals.isdisjoint(current))
    n = len(order)
    by_class = np.array(rows, dtype=np.int32).reshape(n, n_classes)
    by_class[by_class < 0] = n
    table = np.vstack([by_class, np.full((1, n_classes), n, dtype=np.int32)])
    return table, class_of, np.array([*accepting, False], dtype=np.bool_)


class _Closures:
    """Epsilon closures of encoded NFA states (state * 3 + mode), memoised per state."""

    def __init__(self, nfa: _Nfa) -> None:
        self._nfa = nfa
        self._memo: dict[tuple[int, bool], frozenset[int]] = {}

    def of(self, seed: Iterable[int], at_start: bool) -> frozenset[int]:
        out: set[int] = set()
        for code in seed:
            out |= self._one(code, at_start)
        return frozenset(out)

    def _one(self, code: int, at_start: bool) -> frozenset[int]:
        key = (code, at_start)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        nfa = self._nfa
        seen = {code}
        stack = [code]
        while stack:
            state, mode = divmod(stack.pop(), 3)
            moves = [t * 3 + mode for t in nfa.eps[state]]
            if at_start:
                moves += [t * 3 + mode for t in nfa.begin[state]]
            moves += [t * 3 + _ENDED for t in nfa.end[state]]
            for target in nfa.dollar[state]:
                moves.append(target * 3 + _ENDED)
                if mode == _NORMAL:
                    moves.append(target * 3 + _NL_PENDING)
            for move in moves:
                if move not in seen:
                    seen.add(move)
                    stack.append(move)
        result = frozenset(seen)
        self._memo[key] = result
        return result


def _prune_and_minimise(
    table: npt.NDArray[np.int32], accepting: npt.NDArray[np.bool_], start: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_], int]:
    """Map states that cannot reach acceptance to dead, merge equivalent states (Moore's
    partition refinement, vectorised), renumber in BFS order from the start (deterministic),
    dead last."""
    n, width = table.shape
    dead = n - 1
    dist = distances_to_accept(table, accepting, np.ones(width, dtype=np.bool_))
    live = dist < UNREACHABLE
    table = np.where(live[table], table, dead).astype(np.int32)
    table[~live] = dead
    # Moore refinement: class = (accepting, live); refine by successor classes until stable.
    # Rows are compared as raw bytes (a void view), much faster than np.unique(axis=0).
    labels = np.where(live, accepting.astype(np.int64), 2)
    count = len(np.unique(labels))
    while True:
        signature = np.ascontiguousarray(np.hstack([labels[:, None], labels[table]]))
        rows = signature.view(np.dtype((np.void, signature.itemsize * (width + 1)))).ravel()
        _, labels = np.unique(rows, return_inverse=True)
        labels = labels.reshape(-1).astype(np.int64)
        new_count = int(labels.max()) + 1
        if new_count == count:
            break
        count = new_count
    return _renumber(table, accepting, labels, start, int(labels[dead]))


def _renumber(
    table: npt.NDArray[np.int32],
    accepting: npt.NDArray[np.bool_],
    labels: npt.NDArray[np.int64],
    start: int,
    dead_label: int,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_], int]:
    width = table.shape[1]
    if labels[start] == dead_label:
        return np.zeros((1, width), dtype=np.int32), np.zeros(1, dtype=np.bool_), 0
    representative: dict[int, int] = {}
    for state in range(table.shape[0]):
        representative.setdefault(int(labels[state]), state)
    new_id = {int(labels[start]): 0}
    queue = deque([int(labels[start])])
    while queue:
        label = queue.popleft()
        for target in np.unique(table[representative[label]]):
            target_label = int(labels[target])
            if target_label != dead_label and target_label not in new_id:
                new_id[target_label] = len(new_id)
                queue.append(target_label)
    size = len(new_id)
    out = np.full((size + 1, width), size, dtype=np.int32)
    out_accepting = np.zeros(size + 1, dtype=np.bool_)
    mapping = np.full(int(labels.max()) + 1, size, dtype=np.int32)
    for label, index in new_id.items():
        mapping[label] = index
    for label, index in new_id.items():
        rep = representative[label]
        out[index] = mapping[labels[table[rep]]]
        out_accepting[index] = accepting[rep]
    return out, out_accepting, 0
