"""JSON Schema patterns rewritten around an llguidance 1.7 soundness bug with `"` and `\\`.

llguidance matches a string's pattern against the JSON text of the string: it turns each
byte set of the regex into the JSON spellings of its bytes (derivre's `json_quote`,
src/regexbuilder.rs, `quote_byteset`). When a byte set holds every control byte 0x00-0x1F
(or all of them but `\\n`), it takes a short cut, `quote_all_ctrl`, that allows every escape
`\\" \\\\ \\b \\f \\n \\r \\t` whether or not the set holds `"` and `\\`. So `[^"]` (which
holds the control bytes) also matches the JSON text `\\"`, and `{"pattern": "^[^\\"]+$"}`
accepts `a"b`. A set missing one control byte takes the exact path (`[^"\\x00]` is right).
derivre merges the byte sets of an alternation into one before it quotes them, so
`(?:[\\x00-\\x0f]|[\\x10-\\x1f]|[^"\\x00-\\x1f])` is hit too, although no one class is.

The workaround keeps U+0000 out of every atom that can match it without also matching both
`"` and `\\`: such an atom `A` is written `[A--\\x00]` (class difference, regex-syntax).
Then a byte set that holds 0x00 (after any merge) holds `"` and `\\` too, where the short
cut is right, and every other byte set misses 0x00 and takes the exact path. The pattern
then matches fewer strings: those with U+0000 at a rewritten atom (sound: never an invalid
instance; a string with a NUL character under such a pattern is rare). Atoms whose set this
module cannot work out (`\\p{..}`, nested classes, class set operations) are rewritten too.

Patterns are read as llguidance reads them (Rust regex-syntax after `regex_to_lark`, which
makes `\\d` and `\\w` ASCII), not as ECMA-262: `]` first in a class is a literal, `[` in a
class opens a nested class. A pattern this scan cannot read is left as it is (llguidance
refuses it, or it has no class to fix).
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["fix_patterns", "open_pattern_property", "safe_pattern"]

_NUL, _QUOTE, _BACKSLASH = 0x00, 0x22, 0x5C
# The members of a set that decide whether it must be rewritten.
_WATCHED = (_NUL, _QUOTE, _BACKSLASH)
# Single-letter escapes with a fixed character (regex-syntax).
_SIMPLE = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07, "e": 0x1B}
_HEX = re.compile(r"x\{([0-9a-fA-F]{1,8})\}|x([0-9a-fA-F]{2})|u\{([0-9a-fA-F]{1,8})\}"
                  r"|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})")
_PROPERTY = re.compile(r"[pP](\{[^}]*\}|.)", re.DOTALL)
# What a class escape matches among the watched characters (`\\s` is Unicode White_Space:
# none of them; `\\D \\W \\S` hold all three).
_CLASS_ESCAPES = {"d": frozenset(), "w": frozenset(), "s": frozenset(),
                  "D": frozenset(_WATCHED), "W": frozenset(_WATCHED), "S": frozenset(_WATCHED)}


def fix_patterns(sub: dict[str, Any]) -> None:
    """Rewrite, in place, the `pattern` of one subschema and the names of its
    `patternProperties` (llguidance quotes both the same way, parser/src/json/compiler.rs).

    A `patternProperties` name is rewritten only where `additionalProperties` is `false`:
    elsewhere a property name with U+0000 that the rewritten pattern no longer matches
    would be checked against `additionalProperties` instead of the pattern's schema. Left
    as it is, the name also matches names with `"` or `\\` that it should not, which are
    then checked against the pattern's schema: fewer values where `additionalProperties`
    is absent or `true`; where it is another schema, `open_pattern_property` refuses it."""
    pattern = sub.get("pattern")
    if isinstance(pattern, str):
        sub["pattern"] = safe_pattern(pattern)
    props = sub.get("patternProperties")
    if isinstance(props, dict) and sub.get("additionalProperties") is False:
        renamed = {safe_pattern(name): value for name, value in props.items()}
        if len(renamed) == len(props):  # two names never meet; if they would, keep them
            sub["patternProperties"] = renamed


def open_pattern_property(sub: dict[str, Any]) -> str | None:
    """The first `patternProperties` name of one subschema that llguidance would let match
    names with `"` or `\\` while `additionalProperties` is a schema that such a name should
    be checked against instead (not `false`, `true` or `{}`), or None. A name with `"` would
    then escape `additionalProperties`: an invalid instance taken."""
    props = sub.get("patternProperties")
    extra = sub.get("additionalProperties", True)
    if not isinstance(props, dict) or extra is False or extra is True or extra == {}:
        return None
    return next((name for name in props if safe_pattern(name) != name), None)


@functools.lru_cache(maxsize=4096)
def safe_pattern(pattern: str) -> str:
    """`pattern` with every atom that could trigger the short cut written `[A--\\x00]` (see
    the module docstring); the pattern as it is when nothing needs it or the scan fails.
    Cached: the same patterns (formats', negations') recur across subschemas and schemas,
    and a long one takes milliseconds to scan."""
    if "[" not in pattern and "\\" not in pattern and "\x00" not in pattern:
        return pattern  # no class, escape or NUL: no atom to rewrite
    out: list[str] = []
    i, n = 0, len(pattern)
    changed = False
    while i < n:
        c = pattern[i]
        if c == "[":
            end = _class_end(pattern, i)
            if end is None:
                return pattern
            atom = pattern[i:end]
            members = _class_members(atom)
        elif c == "\\":
            end = _escape_end(pattern, i)
            if end is None:
                return pattern
            atom = pattern[i:end]
            members = _escape_members(atom)
        elif c == "\x00":
            end, atom, members = i + 1, "\\x00", frozenset({_NUL})
        else:
            out.append(c)
            i += 1
            continue
        if members is None or (_NUL in members and not {_QUOTE, _BACKSLASH} <= members):
            out.append(f"[{atom}--\\x00]")
            changed = True
        else:
            out.append(pattern[i:end])
        i = end
    return "".join(out) if changed else pattern


def _escape_end(text: str, i: int) -> int | None:
    """The end of the escape starting at text[i] == '\\\\', or None at a dangling one."""
    if i + 1 >= len(text):
        return None
    hexed = _HEX.match(text, i + 1)
    if hexed:
        return hexed.end()
    prop = _PROPERTY.match(text, i + 1)
    if prop:
        return prop.end()
    return i + 2


def _escape_members(atom: str) -> frozenset[int] | None:
    """The watched characters an escape outside a class matches (None: a Unicode property,
    not worked out). Assertions (`\\b`, `\\A`...) match no character."""
    body = atom[1:]
    if body[0] in "pP":
        return None
    if body in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[body]
    code = _escape_code(body)
    return frozenset() if code is None else frozenset({code}) & frozenset(_WATCHED)


def _escape_code(body: str) -> int | None:
    """The one character an escape (text after the backslash) stands for, or None."""
    hexed = _HEX.fullmatch(body)
    if hexed:
        return int(next(g for g in hexed.groups() if g is not None), 16)
    if body in _SIMPLE:
        return _SIMPLE[body]
    if len(body) == 1 and not body.isalnum():
        return ord(body)  # an escaped punctuation character is itself
    return None


def _class_end(text: str, i: int) -> int | None:
    """The end (after its `]`) of the class opening at text[i], nested classes included."""
    depth = 0
    j = i
    n = len(text)
    while j < n:
        c = text[j]
        if c == "[":
            depth += 1
            j += 1
            if j < n and text[j] == "^":
                j += 1
            if j < n and text[j] == "]":  # a `]` first in a class is itself
                j += 1
            continue
        if c == "\\":
            end = _escape_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _class_members(atom: str) -> frozenset[int] | None:
    """The watched characters a class `[...]` matches (None: nested classes, set operations
    or properties, which this does not work out)."""
    negated = atom.startswith("[^")
    body = atom[2 if negated else 1:-1]
    if not negated and body.endswith("--\\x00"):
        return frozenset()  # already rewritten (set operations are left-associative)
    if any(op in body for op in ("&&", "--", "~~")):
        return None
    members: set[int] = set()
    items: list[int | None] = []  # characters in order; None for a class escape
    k = 0
    while k < len(body):
        c = body[k]
        if c == "[":
            return None
        if c == "\\":
            end = _escape_end(body, k)
            if end is None:
                return None
            esc = body[k + 1:end]
            if esc in _CLASS_ESCAPES:
                members |= _CLASS_ESCAPES[esc]
                items.append(None)
            else:
                code = _escape_code(esc)
                if code is None:
                    return None
                items.append(code)
            k = end
        else:
            items.append(-1 if c == "-" else ord(c))
            k += 1
    # Ranges: a `-` (kept as -1) between two characters; elsewhere it is itself.
    m = 0
    while m < len(items):
        item = items[m]
        if (item == -1 and 0 < m < len(items) - 1 and isinstance(items[m - 1], int)
                and items[m - 1] != -1 and isinstance(items[m + 1], int)):
            lo, hi = items[m - 1], items[m + 1]
            assert lo is not None and hi is not None
            hi = ord("-") if hi == -1 else hi
            members |= {w for w in _WATCHED if lo <= w <= hi}
            m += 2
            continue
        if item is not None:
            members |= {ord("-") if item == -1 else item} & set(_WATCHED)
        m += 1
    if negated:
        return frozenset(_WATCHED) - members
    return frozenset(members)
