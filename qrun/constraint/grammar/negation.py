"""`not` as a schema llguidance compiles: `negate(S)` is a schema valid exactly where `S` is
not, or None when the complement has no form here. The rewrite (rewrite.py) replaces `not`
with it; the `oneOf` rewrite (one_of.py) adds the other branches' complements to each branch.

The forms (all exact, but for U+0000 in a string complement: _other_chars): booleans and
`{}`; `not` (double negation); `type` (but not "integer" alone: "a number that is not an
integer" has no form); `enum`/`const` (per type: the other booleans, null, numbers as open
intervals around the values, strings as a pattern matching every other string; a listed
array or object has no complement here); `required` and `properties` (present with a value
the property's schema refuses); the bounds (`minimum`, `maxLength`, `minItems`..., each the
opposite bound on its own type); `pattern` of the shapes pattern_complement.py has a
complement for; `anyOf`/`allOf` by De Morgan; a local `$ref`, by its
target. A schema of several keywords is the `anyOf` of their complements, where the
keywords are independent (not `properties` beside `additionalProperties`, `items` beside
`prefixItems`...).

Each form is checked against the `jsonschema` validator in
tests/constraint/grammar/test_rewrite.py.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from qrun.constraint.grammar.pattern_complement import not_pattern
from qrun.constraint.grammar.schema import resolve

__all__ = ["ANNOTATIONS", "TYPES", "negate", "not_values"]

TYPES = ("null", "boolean", "object", "array", "number", "string")
# Keywords that never change which instances are valid.
ANNOTATIONS = frozenset({"$schema", "$id", "id", "$comment", "title", "description",
                         "default", "examples", "example", "readOnly", "writeOnly",
                         "deprecated", "$anchor", "$defs", "definitions"})
# A `$ref` is followed at most this deep while negating (a recursive schema has no finite
# complement form).
_REF_DEPTH = 4
# Keywords whose meaning depends on others of their group beside them: a schema with two of
# one group is not split. Those of _ALONE depend on everything beside them (a draft-07
# `$ref` hides its siblings).
_COUPLED = (frozenset({"properties", "patternProperties", "additionalProperties"}),
            frozenset({"items", "prefixItems", "additionalItems"}),
            frozenset({"contains", "minContains", "maxContains"}))
_ALONE = frozenset({"$ref", "$dynamicRef", "$recursiveRef", "unevaluatedProperties",
                    "unevaluatedItems", "if", "then", "else"})
# bound keyword: (the type it applies to, the opposite keyword, the shift of its value)
_BOUNDS = {
    "minimum": ("number", "exclusiveMaximum", 0), "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0), "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}


def negate(inner: Any, root: Any = None, depth: int = 0) -> Any:
    """A schema valid exactly where `inner` is not, else None. `root` is the document
    `$ref`s resolve in (None: a `$ref` has no complement)."""
    if isinstance(inner, bool):
        return not inner
    if not isinstance(inner, dict) or depth > _REF_DEPTH:
        return None
    keys = set(inner) - ANNOTATIONS
    if not keys:
        return False
    if keys == {"required"} or (keys == {"required", "type"}
                                and inner["type"] in ("object", ["object"])):
        return _not_required(inner["required"], typed="type" in keys)
    if len(keys) > 1:
        if keys & _ALONE or any(len(keys & group) > 1 for group in _COUPLED):
            return None
        parts = [negate({key: inner[key]}, root, depth) for key in sorted(keys)]
        return None if any(p is None for p in parts) else _any_of(parts)
    (key,) = keys
    value = inner[key]
    if key == "not":
        return copy.deepcopy(value)
    if key == "type":
        return _other_types(value)
    if key == "enum":
        return not_values(value) if isinstance(value, list) else None
    if key == "const":
        return not_values([value])
    if key in ("anyOf", "allOf") and isinstance(value, list) and value:
        parts = [negate(member, root, depth) for member in value]
        if any(p is None for p in parts):
            return None
        return {"allOf": parts} if key == "anyOf" else _any_of(parts)
    if key == "$ref" and isinstance(value, str) and root is not None:
        target = resolve(root, value)
        return None if target is None else negate(target, root, depth + 1)
    if key == "properties" and isinstance(value, dict):
        return _not_properties(value, root, depth)
    if key in _BOUNDS:
        return _not_bound(key, value)
    if key == "pattern" and isinstance(value, str):
        # Every value but a string passes a `pattern`, so none passes its `not`.
        other = not_pattern(value)  # pattern_complement.py
        return None if other is None else {"type": "string", "pattern": other}
    return None


def not_values(values: list[Any]) -> Any:
    """Every JSON value except `values` (which hold no array or object), else None."""
    if any(isinstance(v, list | dict) for v in values):
        return None
    parts: list[Any] = []
    if None not in values:
        parts.append({"type": "null"})
    booleans = [b for b in (False, True) if not any(v is b for v in values)]
    if booleans:
        parts.append({"enum": booleans})
    numbers = sorted({v for v in values if isinstance(v, int | float)
                      and not isinstance(v, bool)})
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        return None
    parts.extend(_number_gaps(numbers))
    strings = [v for v in values if isinstance(v, str)]
    if strings:
        parts.append({"type": "string", "pattern": f"^{_other_strings(strings)}$"})
    else:
        parts.append({"type": "string"})
    parts.extend({"type": t} for t in ("object", "array"))
    return _any_of(parts)


def _any_of(parts: list[Any]) -> Any:
    parts = [p for p in parts if p is not False]
    if any(p is True for p in parts):
        return True
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _not_required(names: Any, typed: bool) -> Any:
    """not {required: names}: an object lacking one of the names; with `type: object`
    (`typed`), any other value too."""
    if not _names(names):
        return None
    if not names:  # every object has all of no properties
        return {"type": [t for t in TYPES if t != "object"]} if typed else False
    absent = lacks_one(names)  # true of every non-object too (`properties` says nothing)
    return absent if typed else {"type": "object", **absent}


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


def lacks_one(names: list[str]) -> dict[str, Any]:
    """Objects lacking at least one of `names` (anything that is not an object too)."""
    if len(set(names)) == 1:
        return {"properties": {names[0]: False}}
    return {"anyOf": [{"properties": {name: False}} for name in dict.fromkeys(names)]}


def _other_types(value: Any) -> Any:
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        return None
    if "integer" in listed and "number" not in listed:
        return None  # "a number that is not an integer" has no type of its own
    others = [t for t in TYPES if t not in listed]
    return {"type": others} if others else False


def _not_properties(props: dict[str, Any], root: Any, depth: int) -> Any:
    """not {properties: {a: S...}}: an object where some listed property is present with a
    value S refuses."""
    parts: list[Any] = []
    for name, sub in props.items():
        bad = negate(sub, root, depth)
        if bad is None:
            return None
        if bad is not False:
            parts.append({"type": "object", "required": [name], "properties": {name: bad}})
    return _any_of(parts)


def _not_bound(key: str, value: Any) -> Any:
    """not {minLength: n}...: a value of the bound's type past the opposite bound (a value of
    another type meets the bound)."""
    kind, opposite, shift = _BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # draft-04's boolean exclusiveMinimum, or a malformed bound
    if shift and value + shift < 0:
        return False  # every string has at least 0 characters...
    return {"type": kind, opposite: value + shift}


def _number_gaps(numbers: list[int | float]) -> list[dict[str, Any]]:
    """Numbers other than `numbers` (sorted) as open intervals."""
    if not numbers:
        return [{"type": "number"}]
    gaps: list[dict[str, Any]] = [{"type": "number", "exclusiveMaximum": numbers[0]}]
    for low, high in zip(numbers, numbers[1:], strict=False):
        gaps.append({"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": high})
    gaps.append({"type": "number", "exclusiveMinimum": numbers[-1]})
    return gaps


def _other_strings(words: list[str]) -> str:
    """A regex (for `^...$`) matching every string but `words`: at each node of their trie,
    the string ending there (unless a word does), a next character no word continues with
    and then anything, or a character some word continues with and the rest below."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return _complement(trie)


def _complement(node: dict[str, Any]) -> str:
    children = sorted(c for c in node if c)
    alternatives = [] if "" in node else [""]
    if children:
        alternatives.append(f"{_other_chars(children)}[\\s\\S]*")
    else:
        alternatives.append("[\\s\\S]+")
    alternatives.extend(_char(c) + _complement(node[c]) for c in children)
    return "(?:" + "|".join(alternatives) + ")"


def _other_chars(chars: list[str]) -> str:
    """A class of the characters but `chars` and U+0000, as ranges: llguidance 1.7 reads a
    negated class (`[^ab]`) or one holding U+0000 as also taking every JSON escape (`\\\\`,
    `\\"`), whatever it lists (tests/constraint/grammar/test_rewrite.py). A string with
    U+0000 where a listed word goes on is left out of the complement (fewer values)."""
    ranges = []
    low = 1
    # Surrogates are no characters (and no end of a range in either syntax).
    for start, end in sorted({(ord(c), ord(c)) for c in chars} | {(0xD800, 0xDFFF)}):
        if start > low:
            ranges.append((low, start - 1))
        low = max(low, end + 1)
    if low <= 0x10FFFF:
        ranges.append((low, 0x10FFFF))
    return "[" + "".join(_code(a) if a == b else f"{_code(a)}-{_code(b)}"
                         for a, b in ranges) + "]"


def _code(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _char(char: str) -> str:
    """One character for a pattern, in a form both llguidance's regex syntax and Python's
    (the `jsonschema` validator's) read the same, in a class or out."""
    if char.isascii() and char.isalnum():
        return char
    return _code(ord(char))
