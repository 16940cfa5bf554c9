"""Part of stage 3 (lang/declared.py): the common JSON Schemas of typed front matter, checked and
applied without the jsonschema package. Importing jsonschema costs 0.06 s, and 0.87 s where
its format checkers are installed (the dev extra: rfc3987-syntax builds a Lark parser on
import), which alone would break `--check`'s 1 s; the compact spellings (docs/language.md
§4.1) and most written schemas use only the keywords below. A schema with any other keyword
goes to jsonschema."""

from __future__ import annotations

import re
from collections.abc import Callable, Sized
from typing import Any, cast

Problem = tuple[tuple[str | int, ...], str]
"""Where in the value (its path of keys and indexes) and what is wrong."""

_TYPES = ("string", "integer", "number", "boolean", "object", "array", "null")
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly"})
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems")
_KEYWORDS = frozenset({"type", "items", "properties", "required", "additionalProperties",
                       "enum", "const", "pattern", *_NUMBER_KEYS, *_COUNT_KEYS, *_ANNOTATIONS})


def is_simple(schema: Any) -> bool:
    """Whether `schema` uses only the keywords this module knows, all the way down."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not set(schema) <= _KEYWORDS:
        return False
    items = schema.get("items", True)
    extra = schema.get("additionalProperties", True)
    properties = schema.get("properties", {})
    return is_simple(items) and is_simple(extra) and isinstance(properties, dict) and all(
        is_simple(inner) for inner in properties.values())


def schema_problem(schema: Any) -> Problem | None:
    """Where (the path inside the schema) and why a simple schema is not a valid one."""
    if isinstance(schema, bool):
        return None
    for key, value in schema.items():
        problem = _keyword_problem(key, value)
        if problem is not None:
            return (key,), problem
    for key in ("items", "additionalProperties"):
        if key in schema:
            inner = schema_problem(schema[key])
            if inner is not None:
                return (key, *inner[0]), inner[1]
    for name, inner_schema in schema.get("properties", {}).items():
        inner = schema_problem(inner_schema)
        if inner is not None:
            return ("properties", name, *inner[0]), inner[1]
    return None


def _keyword_problem(key: str, value: Any) -> str | None:
    if key == "type":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(
                isinstance(n, str) and n in _TYPES for n in names):
            return f"{value!r} is not a type (types: {', '.join(_TYPES)})"
    elif key in _NUMBER_KEYS and not _is_number(value):
        return f"{value!r} is not of type 'number'"
    elif key in _COUNT_KEYS and not (_is_integer(value) and value >= 0):
        return f"{value!r} is not a non-negative integer"
    elif key == "required" and not (isinstance(value, list) and all(
            isinstance(v, str) for v in value) and len(set(value)) == len(value)):
        return f"{value!r} is not a list of distinct strings"
    elif key == "enum" and not isinstance(value, list):
        return f"{value!r} is not of type 'array'"
    elif key in ("items", "additionalProperties") and not isinstance(value, dict | bool):
        return f"{value!r} is not of type 'object', 'boolean'"
    elif key == "properties" and not isinstance(value, dict):
        return f"{value!r} is not of type 'object'"
    elif key == "pattern":
        if not isinstance(value, str):
            return f"{value!r} is not of type 'string'"
        try:
            re.compile(value)
        except re.error as exc:
            return f"{value!r} is not a regex: {exc}"
    return None


def value_problem(schema: Any, value: Any) -> Problem | None:
    """The first way `value` does not fit a simple, valid `schema` (messages as jsonschema
    words them), or None."""
    if schema is True:
        return None
    if schema is False:
        return (), "False schema does not allow " + repr(value)
    for key, check in _CHECKS.items():
        if key in schema:
            message = check(schema[key], value)
            if message is not None:
                return (), message
    return _inner_problem(schema, value)


def _inner_problem(schema: dict[str, Any], value: Any) -> Problem | None:
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problem = value_problem(schema["items"], item)
            if problem is not None:
                return (index, *problem[0]), problem[1]
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                return (), f"{name!r} is a required property"
        extra = schema.get("additionalProperties", True)
        unexpected = [k for k in value if k not in properties]
        if extra is False and unexpected:
            names = ", ".join(map(repr, unexpected))
            return (), f"Additional properties are not allowed ({names} " \
                       f"{'was' if len(unexpected) == 1 else 'were'} unexpected)"
        for name, item in value.items():
            problem = value_problem(properties.get(name, extra), item)
            if problem is not None:
                return (name, *problem[0]), problem[1]
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return _is_number(value) and (isinstance(value, int) or float(value).is_integer())


_IS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str), "integer": _is_integer, "number": _is_number,
    "boolean": lambda v: isinstance(v, bool), "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list), "null": lambda v: v is None}


def _type(names: Any, value: Any) -> str | None:
    names = [names] if isinstance(names, str) else names
    if any(_IS[name](value) for name in names):
        return None
    return f"{value!r} is not of type {', '.join(repr(name) for name in names)}"


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b) and (_is_number(a) == _is_number(b))


def _bound(test: Callable[[Any, Any], bool], words: str) -> Callable[[Any, Any], str | None]:
    def check(limit: Any, value: Any) -> str | None:
        if _is_number(value) and not test(value, limit):
            return f"{value!r} is {words} {limit!r}"
        return None
    return check


def _length(test: Callable[[int, int], bool], kind: type, words: str
            ) -> Callable[[Any, Any], str | None]:
    def check(limit: Any, value: Any) -> str | None:
        if isinstance(value, kind) and not test(len(cast(Sized, value)), limit):
            return f"{value!r} is {words}"
        return None
    return check


_CHECKS: dict[str, Callable[[Any, Any], str | None]] = {
    "type": _type,
    "enum": lambda options, v: None if any(_equal(v, o) for o in options)
    else f"{v!r} is not one of {options!r}",
    "const": lambda const, v: None if _equal(v, const) else f"{const!r} was expected",
    "minimum": _bound(lambda v, m: v >= m, "less than the minimum of"),
    "maximum": _bound(lambda v, m: v <= m, "greater than the maximum of"),
    "exclusiveMinimum": _bound(lambda v, m: v > m, "less than or equal to the minimum of"),
    "exclusiveMaximum": _bound(lambda v, m: v < m, "greater than or equal to the maximum of"),
    "minLength": _length(lambda n, m: n >= m, str, "too short"),
    "maxLength": _length(lambda n, m: n <= m, str, "too long"),
    "minItems": _length(lambda n, m: n >= m, list, "too short"),
    "maxItems": _length(lambda n, m: n <= m, list, "too long"),
    "pattern": lambda pattern, v: None if not isinstance(v, str) else pattern_problem(pattern, v),
}


PATTERN_TIMEOUT_S = 1.0
"""How long a declared `pattern` may take to search one value: a pattern that backtracks
catastrophically (`^(a+)+$` on forty a's and a '!') would otherwise hold the run, or a server's
request, for minutes (issue #38)."""


def pattern_problem(pattern: str, value: str) -> str | None:
    """Why `value` does not match `pattern` (searched with the regex module, which stops a
    search after PATTERN_TIMEOUT_S), or None when it does."""
    import regex

    try:
        found = regex.search(pattern, value, timeout=PATTERN_TIMEOUT_S)
    except TimeoutError:
        return (f"the pattern {pattern!r} took longer than {PATTERN_TIMEOUT_S:g} s to search "
                f"{_short(value)}")
    return None if found else f"{_short(value)} does not match {pattern!r}"


def _short(value: str) -> str:
    """A value in a message: cut to 60 characters (an input may be 100,000 long)."""
    return repr(value) if len(value) <= 60 else repr(value[:60]) + f"... ({len(value)} characters)"
