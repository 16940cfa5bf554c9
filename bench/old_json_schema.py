"""FROZEN BASELINE, NOT MAINTAINED. This is qrun/stdlib/json_schema.py as it stood at d60a45e,
the parent of 44c0399 ("json= holes on llguidance"), the last commit whose json= holes used it:
the engine behind the "old engine" column of bench/RESULTS.md's "json= engines over the schema
corpus" (measured at 5ae83ee, 2026-11-23, `python -m bench.llg_corpus --write`). Only its
import of PATTERNS has changed since, when the module moved here (6cdf23b). Do not fix, extend
or restyle it: its figures compare with that table only while it stays as it was. Its readers
are bench/llg_check.py (the corpus comparison) and bench/masks.py (a regex to time); qrun/,
tests/ and corpus/ never import it (tests/test_structure.py).

The module as it was:

JSON Schema -> regex for a documented, non-recursive subset, so a `json` hole is masked by
the same byte DFA as any regex (regex/dfa.py). Output is compact but fixed-format JSON:
`{"a": 1, "b": [1, 2]}` (separators ", " and ": ", properties in schema order), because
flexible whitespace both destroys fast-forward forcing and lets small models emit blanks
forever (docs/internals.md §6.3).

Supported: type (one or a list), enum/const (any type), string (minLength, maxLength,
pattern, format date/time/date-time/email/uuid/uri), integer (minimum, maximum,
exclusiveMinimum, exclusiveMaximum: exact for any integer bounds), number (inclusive integer
bounds >= 0 only, then without exponent), boolean, null, array (items, minItems, maxItems),
object (properties, required; additionalProperties is accepted and has no effect because only
declared properties are generated), anyOf, allOf with one member, `$ref` to #/$defs/... or
#/definitions/... (not recursive). Annotations (title, description, default, examples...) are
ignored. Anything else raises SchemaError naming the keyword and its JSON pointer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from qrun.constraint.patterns import PATTERNS
from qrun.regex import PatternError, compile_dfa

__all__ = ["SchemaError", "schema_to_regex"]

# RFC 8259 §7: any char but '"', '\' and U+0000-U+001F, or an escape.
STRING_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
ITEM_SEPARATOR = ", "
KEY_SEPARATOR = ": "

# RFC 3339 full-time (what JSON Schema's "time" format means): the offset is required.
_RFC3339_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_FORMATS = {
    "date": PATTERNS["DATE"],
    "time": _RFC3339_TIME,
    "date-time": PATTERNS["DATETIME"],
    "email": PATTERNS["EMAIL"],
    "uuid": PATTERNS["UUID"],
    "uri": PATTERNS["URL"],
}
# Keywords with no effect on the generated language (annotations, containers of definitions).
_IGNORED = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$schema",
        "$id",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$defs",
        "definitions",
        "additionalProperties",
    }
)
_BY_TYPE = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
_GENERAL = frozenset({"type", "enum", "const", "anyOf", "allOf", "$ref"})
_KNOWN = _IGNORED | _GENERAL | frozenset().union(*_BY_TYPE.values())
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


class SchemaError(ValueError):
    """A JSON Schema uses something outside the supported subset, or is malformed. The message
    names the keyword and its JSON pointer (e.g. `#/properties/age/multipleOf`)."""


def schema_to_regex(schema: dict[str, Any]) -> str:
    """A regex (qrun syntax, full match) whose matches are JSON texts valid under `schema`.

    Raises:
        SchemaError: unsupported keyword, type or format, recursive or unresolvable $ref.
    """
    if not isinstance(schema, dict):
        raise SchemaError("a JSON Schema must be an object")
    return _Translator(schema).value(schema, "#", ())


class _Translator:
    """One translation: holds the root for $ref lookups."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def value(self, schema: Any, path: str, refs: tuple[str, ...]) -> str:
        if schema is True or schema == {}:
            raise SchemaError(
                f"schema at {path} allows any JSON value, which needs recursion; give it a type"
            )
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {path} must be an object")
        for key in schema:
            if key not in _KNOWN:
                raise SchemaError(f"unsupported JSON Schema keyword '{key}' at {path}/{key}")
        if "$ref" in schema:
            return self._ref(schema, path, refs)
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return self._enum(schema, path)
        if "anyOf" in schema:
            return self._any_of(schema, path, refs)
        if "allOf" in schema:
            return self._all_of(schema, path, refs)
        types = schema.get("type")
        if types is None:
            raise SchemaError(f"schema at {path} has no 'type' (nor enum, const, anyOf, $ref)")
        if isinstance(types, str):
            types = [types]
        options = [self._typed(t, schema, path, refs) for t in types]
        return options[0] if len(options) == 1 else _group("|".join(options))

    def _typed(self, kind: Any, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        if kind == "string":
            return self._string(schema, path)
        if kind == "integer":
            return _integer(schema, path)
        if kind == "number":
            return _number(schema, path)
        if kind == "boolean":
            return "(true|false)"
        if kind == "null":
            return "null"
        if kind == "array":
            return self._array(schema, path, refs)
        if kind == "object":
            return self._object(schema, path, refs)
        raise SchemaError(f"unsupported type {kind!r} at {path}/type")

    def _ref(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        ref = schema["$ref"]
        extra = [k for k in schema if k not in _IGNORED and k != "$ref"]
        if extra:
            raise SchemaError(f"keyword '{extra[0]}' next to $ref at {path} is not supported")
        match = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", str(ref))
        if match is None:
            raise SchemaError(f"unsupported $ref {ref!r} at {path}/$ref (only #/$defs/NAME)")
        if ref in refs:
            raise SchemaError(f"recursive $ref {ref!r} at {path}/$ref cannot be a regex")
        target = self.root.get(match.group(1), {}).get(match.group(2))
        if target is None:
            raise SchemaError(f"$ref {ref!r} at {path}/$ref does not resolve")
        return self.value(target, ref, (*refs, ref))

    def _enum(self, schema: dict[str, Any], path: str) -> str:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"'enum' at {path}/enum must be a non-empty array")
        types = schema.get("type")
        if types is not None:
            kinds = [types] if isinstance(types, str) else list(types)
            values = [v for v in values if any(_is_type(v, k) for k in kinds)]
            if not values:
                raise SchemaError(f"no 'enum' value at {path}/enum has the schema's type")
        return _group("|".join(_literal(v) for v in values))

    def _any_of(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise SchemaError(f"'anyOf' at {path}/anyOf must be a non-empty array")
        siblings = [k for k in schema if k not in _IGNORED and k != "anyOf"]
        if siblings:
            raise SchemaError(f"keyword '{siblings[0]}' next to anyOf at {path} is not supported")
        parts = [self.value(o, f"{path}/anyOf/{i}", refs) for i, o in enumerate(options)]
        return _group("|".join(parts))

    def _all_of(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        members = schema["allOf"]
        siblings = [k for k in schema if k not in _IGNORED and k != "allOf"]
        if not isinstance(members, list) or len(members) != 1 or siblings:
            raise SchemaError(
                f"'allOf' at {path}/allOf is only supported with exactly one member and no "
                "sibling keywords (intersections cannot be written as a regex here)"
            )
        return self.value(members[0], f"{path}/allOf/0", refs)

    def _string(self, schema: dict[str, Any], path: str) -> str:
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in _FORMATS:
                raise SchemaError(
                    f"unsupported string format {fmt!r} at {path}/format "
                    f"(supported: {', '.join(sorted(_FORMATS))})"
                )
            if "pattern" in schema or "minLength" in schema or "maxLength" in schema:
                raise SchemaError(f"'format' at {path} cannot be combined with pattern/lengths")
            return f'"{_FORMATS[fmt]}"'
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise SchemaError(
                    f"'pattern' at {path} cannot be combined with minLength/maxLength"
                )
            return f'"{_string_pattern(schema["pattern"], f"{path}/pattern")}"'
        low = _count(schema, "minLength", path, 0)
        high = _count(schema, "maxLength", path, None)
        return f'"{_repeat(STRING_CHAR, low, high, path)}"'

    def _array(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        if "items" not in schema:
            raise SchemaError(f"array at {path} needs 'items' (any JSON value needs recursion)")
        item = self.value(schema["items"], f"{path}/items", refs)
        low = _count(schema, "minItems", path, 0) or 0
        high = _count(schema, "maxItems", path, None)
        _check_bounds(low, high, path, "minItems")
        sep = re.escape(ITEM_SEPARATOR)
        if high == 0:
            return r"\[\]"
        rest_low = max(low - 1, 0)
        rest_high = None if high is None else high - 1
        rest = "" if rest_high == 0 else _repeat(f"{sep}{item}", rest_low, rest_high, path)
        body = f"{item}{rest}"
        return rf"\[{body}\]" if low >= 1 else rf"\[({body})?\]"

    def _object(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError(f"'properties' / 'required' at {path} are malformed")
        for name in required:
            if name not in properties:
                raise SchemaError(
                    f"required property {name!r} at {path}/required is not in 'properties'"
                )
        members = [
            (
                re.escape(json.dumps(name, ensure_ascii=False))
                + re.escape(KEY_SEPARATOR)
                + self.value(sub, f"{path}/properties/{_pointer(name)}", refs),
                name in required,
            )
            for name, sub in properties.items()
        ]
        return r"\{" + _members(members) + r"\}"


def _members(members: list[tuple[str, bool]]) -> str:
    """Properties in order with ", " between the present ones; optional ones may be absent.
    first(i): no member emitted yet; later(i): one was, so each present one is preceded by ", "."""
    sep = re.escape(ITEM_SEPARATOR)

    def later(i: int) -> str:
        parts = (f"{sep}{member}" for member, _ in members[i:])
        return "".join(
            part if req else f"({part})?" for part, (_, req) in zip(parts, members[i:], strict=True)
        )

    def first(i: int) -> str:
        if i == len(members):
            return ""
        member, req = members[i]
        if req:
            return member + later(i + 1)
        return _group(f"{member}{later(i + 1)}|{first(i + 1)}")

    return first(0)


def _integer(schema: dict[str, Any], path: str) -> str:
    low, high = _int_bounds(schema, path, integral_only=False)
    if low is None and high is None:
        return INTEGER
    return _group("|".join(_int_range(low, high, path)))


def _number(schema: dict[str, Any], path: str) -> str:
    if not any(k in schema for k in _BY_TYPE["number"]):
        return NUMBER
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            raise SchemaError(f"'{key}' on a number at {path}/{key} is not supported")
    low, high = _int_bounds(schema, path, integral_only=True)
    if low is None or low < 0:
        raise SchemaError(
            f"number bounds at {path} need an integer 'minimum' >= 0 (other bounds are not "
            "expressible); use type integer or drop the bound"
        )
    fraction = r"(\.[0-9]+)?"
    if high is None:
        return _group("|".join(_int_range(low, None, path))) + fraction
    if high < low:
        raise SchemaError(f"'maximum' < 'minimum' at {path}")
    exact = f"{high}(\\.0+)?"
    if high == low:
        return exact
    below = _group("|".join(_int_range(low, high - 1, path))) + fraction
    return _group(f"{below}|{exact}")


def _int_bounds(
    schema: dict[str, Any], path: str, integral_only: bool
) -> tuple[int | None, int | None]:
    bounds: list[int | None] = [None, None]
    for slot, key, shift in (
        (0, "minimum", 0),
        (0, "exclusiveMinimum", 1),
        (1, "maximum", 0),
        (1, "exclusiveMaximum", -1),
    ):
        if key not in schema:
            continue
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"'{key}' at {path}/{key} must be a number")
        if isinstance(value, float) and not value.is_integer():
            if integral_only:
                raise SchemaError(f"non-integer '{key}' at {path}/{key} is not supported")
            # Integers above 2.5 are those >= 3: round towards the allowed side.
            value = int(value // 1 + 1) if slot == 0 else int(value // 1)
            shift = 0
        bound = int(value) + shift
        current = bounds[slot]
        if current is None:
            bounds[slot] = bound
        else:
            bounds[slot] = max(current, bound) if slot == 0 else min(current, bound)
    low, high = bounds
    if low is not None and high is not None and low > high:
        raise SchemaError(f"integer bounds at {path} leave no value ({low} > {high})")
    return low, high


def _int_range(low: int | None, high: int | None, path: str) -> list[str]:
    """Alternatives matching exactly the canonical decimal integers in [low, high]."""
    out: list[str] = []
    if low is None or low < 0:
        # Negative part: -n for n in [max(1, -high), -low].
        neg_low = 1 if high is None or high >= 0 else -high
        neg_high = None if low is None else -low
        if neg_high is None or neg_high >= neg_low:
            out += [f"-{alt}" for alt in _nonneg_range(neg_low, neg_high)]
    if high is None or high >= 0:
        out += _nonneg_range(max(low or 0, 0), high)
    if not out:
        raise SchemaError(f"integer bounds at {path} leave no value")
    return out


def _nonneg_range(low: int, high: int | None) -> list[str]:
    """Alternatives for canonical decimals in [low, high] (high None: unbounded), low >= 0."""
    out: list[str] = []
    width = len(str(low))
    while high is None or low <= high:
        top = 10**width - 1
        if high is not None and high <= top:
            out += _same_width(str(low), str(high))
            break
        out += _same_width(str(low), str(top))
        if high is None:
            out.append(f"[1-9][0-9]{{{width},}}")
            break
        low, width = top + 1, width + 1
    return out


def _same_width(low: str, high: str) -> list[str]:
    """Digit strings of one width between low and high (no leading-zero concerns: the first
    digit of a multi-digit `low` is never 0)."""
    if not low:
        return [""]
    if low[0] == high[0]:
        return [low[0] + alt for alt in _same_width(low[1:], high[1:])]
    n = len(low) - 1
    out: list[str] = []
    first_full, last_full = int(low[0]), int(high[0])
    if low[1:] != "0" * n:
        out += [low[0] + alt for alt in _same_width(low[1:], "9" * n)]
        first_full += 1
    if high[1:] != "9" * n:
        out += [high[0] + alt for alt in _same_width("0" * n, high[1:])]
        last_full -= 1
    if first_full <= last_full:
        digits = str(first_full) if first_full == last_full else f"[{first_full}-{last_full}]"
        out.append(digits + (f"[0-9]{{{n}}}" if n else ""))
    return out


def _string_pattern(pattern: Any, path: str) -> str:
    """A `pattern` keyword as the body of a JSON string. JSON Schema patterns search (are
    unanchored), so unanchored sides get STRING_CHAR* padding. The pattern applies to the
    JSON text between the quotes (escapes are not decoded) and must never produce '"', '\\'
    or control characters: checked exactly on its DFA."""
    if not isinstance(pattern, str):
        raise SchemaError(f"'pattern' at {path} must be a string")
    body = pattern
    anchored_start = body.startswith("^")
    anchored_end = body.endswith("$") and not body.endswith("\\$")
    body = body[1 if anchored_start else 0 : len(body) - 1 if anchored_end else len(body)]
    try:
        dfa = compile_dfa(body)
    except PatternError as exc:
        raise SchemaError(f"'pattern' at {path}: {exc}") from None
    forbidden = [ord('"'), ord("\\"), *range(0x20)]
    live = dfa.transitions[: dfa.dead][:, forbidden] != dfa.dead
    if live.any():
        raise SchemaError(
            f"'pattern' at {path} can produce '\"', '\\' or control characters, which must be "
            'escaped inside a JSON string; exclude them (e.g. [^"\\\\] instead of .)'
        )
    pad = f"{STRING_CHAR}*"
    return f"{'' if anchored_start else pad}({body}){'' if anchored_end else pad}"


def _count(schema: dict[str, Any], key: str, path: str, default: int | None) -> int | None:
    value = schema.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise SchemaError(f"'{key}' at {path}/{key} must be a non-negative integer")
    return value


def _check_bounds(low: int | None, high: int | None, path: str, key: str) -> None:
    if low is not None and high is not None and low > high:
        raise SchemaError(f"'{key}' > maximum at {path}/{key}")


def _repeat(unit: str, low: int | None, high: int | None, path: str) -> str:
    low = low or 0
    _check_bounds(low, high, path, "minLength")
    if high is None:
        return f"{_group(unit)}{{{low},}}" if low else f"{_group(unit)}*"
    return f"{_group(unit)}{{{low},{high}}}"


def _group(text: str) -> str:
    return f"({text})"


def _literal(value: Any) -> str:
    return re.escape(
        json.dumps(value, ensure_ascii=False, separators=(ITEM_SEPARATOR, KEY_SEPARATOR))
    )


def _is_type(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES.get(kind, ()))


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
