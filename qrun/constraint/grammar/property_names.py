"""`propertyNames` (llguidance 1.7 refuses the keyword) as the properties an object may have:

- a name schema that only says "a string" (every name is one) is dropped;
- `false` admits no property, and a finite list of names (`enum`/`const`, filtered by the
  rest of the name schema with the `jsonschema` validator) becomes those names listed in
  `properties` (each with the schemas JSON Schema applies to it: its `properties` entry and
  every `patternProperties` entry it matches, else `additionalProperties`), no
  `patternProperties` and `additionalProperties: false`;
- a name schema that is one `pattern`, or only length bounds, becomes that pattern: the
  additional properties (`additionalProperties`, default true) move to
  `patternProperties: {P: ...}` and `additionalProperties` becomes false (a
  `patternProperties` key matches anywhere in the name, as `pattern` does).

Listed properties whose name the schema refuses become `false` (absent); a listed one it
takes beside a pattern and an `additionalProperties` that says something stays refused (the
pattern would match that name too). Anything else
(other `patternProperties` beside a pattern, a name schema with `not`, `oneOf`, `format`...)
stays as written and is refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

from qrun.constraint.grammar.schema import resolve

__all__ = ["property_names"]

_ANNOTATIONS = frozenset({"$schema", "$id", "id", "$comment", "title", "description",
                          "default", "examples", "example", "readOnly", "writeOnly",
                          "deprecated", "$anchor"})
_LENGTHS = frozenset({"minLength", "maxLength"})
# `patternProperties` keys that match every name (any name gets their schema).
_EVERY_NAME = frozenset({"", ".*", "^.*", ".*$", "^.*$"})
_DEPTH = 3


def property_names(sub: dict[str, Any], root: Any, draft: int, formats: str = "assert") -> None:
    """Rewrite `sub`'s `propertyNames` in place where the module docstring says how;
    `root` resolves local `$ref`s (None: not followed), `draft` is the document's, `formats`
    how its `format`s are read (formats.py MODES: "annotation" checks none). A name schema
    the validator cannot read (a bad pattern, a bound that is not a number) stays as written,
    for llguidance to refuse with its reason."""
    try:
        _property_names(sub, root, draft, formats != "annotation")
    except Exception:  # noqa: BLE001 - jsonschema on an unchecked name schema: re.error,
        return  # TypeError, UnknownType...; nothing was written yet (writes come last)


def _property_names(sub: dict[str, Any], root: Any, draft: int, check_formats: bool) -> None:
    if "propertyNames" not in sub:
        return
    names = _resolved(sub["propertyNames"], root)
    if names is None or '"$ref"' in json.dumps(names):  # the validator would not resolve it
        return
    if names is not False and not _says_more(names):
        del sub["propertyNames"]
        return
    listed, patterns = sub.get("properties", {}), sub.get("patternProperties", {})
    additional = sub.get("additionalProperties", True)
    if not isinstance(listed, dict) or not isinstance(patterns, dict):
        return
    if names is False or "enum" in names or "const" in names:
        _finite(sub, names, listed, patterns, additional, _validator(draft, check_formats))
        return
    kept = set(names) - _ANNOTATIONS - {"type"}
    if kept == {"pattern"} and isinstance(names["pattern"], str):
        pattern = names["pattern"]
    elif kept and kept <= _LENGTHS and all(_count(names.get(k, 0)) for k in kept):
        low, high = names.get("minLength", 0), names.get("maxLength", "")
        pattern = f"^[\\s\\S]{{{low},{high}}}$"
    else:
        return
    if not _compiles(pattern):
        return
    if patterns:
        # Other patterns would keep names the name schema refuses: only one that matches
        # every name (so `additionalProperties` never applies) is replaced by the new one.
        if len(patterns) != 1 or next(iter(patterns)) not in _EVERY_NAME:
            return
        additional = next(iter(patterns.values()))
    valid = _validator(draft, check_formats)(names)
    if not patterns and additional not in (True, {}) and any(map(valid.is_valid, listed)):
        return  # the new pattern would apply `additionalProperties` to a listed property
    new_listed = {name: (value if valid.is_valid(name) else False)
                  for name, value in listed.items()}
    if "properties" in sub:
        sub["properties"] = new_listed
    sub["patternProperties"] = {pattern: additional}
    sub["additionalProperties"] = False
    del sub["propertyNames"]


def _finite(sub: dict[str, Any], names: Any, listed: dict[str, Any],
            patterns: dict[str, Any], additional: Any, validator: Any) -> None:
    choices = [] if names is False else names["enum"] if "enum" in names \
        else [names["const"]]
    if not isinstance(choices, list) or not all(_compiles(p) for p in patterns):
        return
    valid = validator(names)
    allowed = [c for c in dict.fromkeys(c for c in choices if isinstance(c, str))
               if valid.is_valid(c)]
    properties: dict[str, Any] = {name: False for name in listed if name not in allowed}
    for name in allowed:
        # What JSON Schema applies to a property of this name: its `properties` entry and
        # every `patternProperties` entry whose pattern it matches, else
        # `additionalProperties`. The patterns go: left in place they would still take names
        # the list refuses (a `.*` key takes every name).
        schemas = [listed[name]] if name in listed else []
        schemas += [schema for p, schema in patterns.items() if re.search(p, name)]
        if not schemas:
            schemas = [additional]
        properties[name] = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
    sub["properties"] = properties
    sub["additionalProperties"] = False
    sub.pop("patternProperties", None)
    del sub["propertyNames"]


def _resolved(names: Any, root: Any) -> Any:
    """The name schema with local `$ref`s at its top followed; None when one is not local,
    dangles, or has siblings that say something."""
    for _ in range(_DEPTH):
        if not isinstance(names, dict) or "$ref" not in names:
            return names if isinstance(names, bool | dict) else None
        if root is None or set(names) - _ANNOTATIONS - {"$ref"} \
                or not isinstance(names["$ref"], str):
            return None
        names = resolve(root, names["$ref"])
    return None


def _says_more(names: Any) -> bool:
    """Whether a name schema refuses some string (not only annotations and a `type` that
    takes strings)."""
    if names is True:
        return False
    types = names.get("type", "string")
    types = [types] if isinstance(types, str) else types
    return bool(set(names) - _ANNOTATIONS - {"type"}) or not isinstance(types, list) \
        or "string" not in types


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _compiles(pattern: Any) -> bool:
    """Whether Python reads `pattern` (the `jsonschema` validator matches with `re.search`)."""
    if not isinstance(pattern, str):
        return False
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _validator(draft: int, check_formats: bool) -> Any:
    """The `jsonschema` validator class of `draft` (imported here: 60 ms, on the first
    `propertyNames` only), format checks on as in finite.py."""
    import jsonschema

    cls = {3: jsonschema.Draft3Validator, 4: jsonschema.Draft4Validator,
           6: jsonschema.Draft6Validator, 7: jsonschema.Draft7Validator,
           2019: jsonschema.Draft201909Validator}.get(draft, jsonschema.Draft202012Validator)
    checker = jsonschema.FormatChecker() if check_formats else None
    return lambda schema: cls(schema, format_checker=checker)
