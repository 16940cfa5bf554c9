"""Character sets as sorted, merged, inclusive codepoint ranges, and their UTF-8 byte sequences:
the values the regex front end (syntax.py) builds and both back ends (dfa.py, portable.py) read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

Ranges = tuple[tuple[int, int], ...]
"""Sorted, non-overlapping, non-adjacent inclusive codepoint ranges, surrogates excluded."""

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
NEWLINE = 0x0A
# ASCII classes: what `\d`, `\w` and `\s` mean in qrun (regex/syntax.py, docs/language.md §7.3).
DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))


def normalise(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sort, merge, and drop surrogates (they have no UTF-8 encoding)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    result: list[tuple[int, int]] = []
    s_lo, s_hi = SURROGATES
    for lo, hi in out:
        if lo < s_lo:
            result.append((lo, min(hi, s_lo - 1)))
        if hi > s_hi:
            result.append((max(lo, s_hi + 1), hi))
    return tuple(result)


def complement(ranges: Ranges) -> Ranges:
    """Every encodable codepoint not in `ranges`."""
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return normalise(out)


def fold_ascii(ranges: Ranges) -> Ranges:
    """(?i) under ASCII semantics: add the other case of every ASCII letter in the set."""
    extra: list[tuple[int, int]] = []
    for lo, hi in ranges:
        for a, b, delta in ((0x41, 0x5A, 32), (0x61, 0x7A, -32)):
            x, y = max(lo, a), min(hi, b)
            if x <= y:
                extra.append((x + delta, y + delta))
    return normalise((*ranges, *extra))


def utf8_sequences(lo: int, hi: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Split a surrogate-free codepoint range into sequences of byte ranges whose concatenation
    is exactly its UTF-8 encodings (the algorithm of Rust's regex-syntax `Utf8Sequences`)."""
    for boundary in (0x7F, 0x7FF, 0xFFFF):
        if lo <= boundary < hi:
            yield from utf8_sequences(lo, boundary)
            yield from utf8_sequences(boundary + 1, hi)
            return
    if hi <= 0x7F:
        yield ((lo, hi),)
        return
    for i in (1, 2, 3):
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask:
                yield from utf8_sequences(lo, lo | mask)
                yield from utf8_sequences((lo | mask) + 1, hi)
                return
            if hi & mask != mask:
                yield from utf8_sequences(lo, (hi & ~mask) - 1)
                yield from utf8_sequences(hi & ~mask, hi)
                return
    yield tuple(zip(chr(lo).encode(), chr(hi).encode(), strict=True))
