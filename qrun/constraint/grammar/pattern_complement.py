"""The complement of a few `pattern` shapes, as a pattern: `not: {pattern: P}` holds for a
string P does not match (negation.py). Regular languages are closed under complement, but
llguidance 1.7 has no complement operator in a JSON Schema pattern and a general
complement's regex can be exponentially long; these shapes have short exact ones (X is one
character item: a class `[...]`, an escape `\\d`, `\\s`, `\\w` or an escaped or plain
character; Y is its complement item):

- `^X+$` (only X characters, at least one): complement `^(?:[\\s\\S]*Y[\\s\\S]*)?$` (empty, or
  holding a Y);
- `^X*$`: complement `^[\\s\\S]*Y[\\s\\S]*$`;
- `X` alone, or `(X)` (holding an X, as a `pattern` searches): complement `^Y*$`.

Anything else has no form here (None).
"""

from __future__ import annotations

import re

__all__ = ["not_pattern"]

# One character item: a class (no nested brackets), an escape, or a plain character.
_ITEM = r"(\[\^?\]?(?:[^\]\\]|\\.)*\]|\\.|[^\\\[\]().*+?{}|^$])"
_ONLY = re.compile(rf"\^{_ITEM}([+*])\$")
_ALONE = re.compile(rf"\(?{_ITEM}\)?")
# Escapes whose complement is the other case (\d and \D...).
_CLASS_ESCAPES = frozenset("dDsSwW")
# Escapes that stand for one character (an escaped punctuation mark, \t, \n...).
_CHAR_ESCAPES = frozenset("tnrfv0") | frozenset(r".,*+?()[]{}|^$\/-")
_ANY = r"[\s\S]"


def not_pattern(pattern: str) -> str | None:
    """A pattern matching exactly the strings `pattern` does not match (module docstring
    shapes), else None."""
    only = _ONLY.fullmatch(pattern)
    if only is not None:
        other = _other(only.group(1))
        if other is None:
            return None
        if only.group(2) == "+":
            return f"^(?:{_ANY}*{other}{_ANY}*)?$"
        return f"^{_ANY}*{other}{_ANY}*$"
    alone = _ALONE.fullmatch(pattern)
    if alone is not None and pattern.startswith("(") == pattern.endswith(")"):
        other = _other(alone.group(1))
        return None if other is None else f"^{other}*$"
    return None


def _other(item: str) -> str | None:
    """The one-character item matching exactly the characters `item` does not."""
    if item.startswith("["):
        body = item[1:-1]
        if body.startswith(("]", "^]")) or body in ("", "^") or "[" in body.replace("\\[", ""):
            return None  # `[]...]` and `[^]` read otherwise in ECMA-262; nested classes
        return f"[{body[1:]}]" if body.startswith("^") else f"[^{body}]"
    if item.startswith("\\"):
        letter = item[1]
        if letter in _CLASS_ESCAPES:
            return "\\" + letter.swapcase()
        return f"[^{item}]" if letter in _CHAR_ESCAPES else None
    return f"[^\\{item}]" if item in "\\]^-" else f"[^{item}]"
