"""Part of stage 3 (compile_template): the front matter's declared types (docs/language.md §4.1).
`inputs:` as a mapping of names to types and `output:` become JSON Schemas here, from a
JSON Schema written out or from the compact spelling (`integer = 3`, `list[string]`,
`string?`); values are checked against them with the reference validator (jsonschema)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from qrun.constraint.grammar.schema import schema_positions
from qrun.errors import suggest
from qrun.jsonio import BadInput, parse_value
from qrun.lang import ast
from qrun.lang.simple_schema import (
    Problem,
    is_simple,
    pattern_problem,
    schema_problem,
    value_problem,
)
from qrun.source import Span

Fail = Callable[[str, Span, tuple[str, ...]], None]

BASE_TYPES: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
    "list": {"type": "array"},
    "null": {"type": "null"},
    "any": {},
}
"""The compact spelling's names and their JSON Schemas; `list[T]`, `dict[T]` and `enum[a, b]`
take arguments (docs/language.md §4.1 has the table)."""
_ALIASES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
            "dict": "object", "array": "list", "map": "dict"}
_SCHEMA_TYPES = ("string", "integer", "number", "boolean", "object", "array", "null")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NO_DEFAULT: Any = object()
MAX_TYPE_DEPTH = 32
"""A compact type nests at most this deep (`list[list[...]]`), as front matter does
(lang/front_matter.py MAX_FRONT_MATTER_DEPTH): reading it recurses once a level."""


class TypeSpellingError(ValueError):
    """A compact type that does not read (the message says why)."""


@dataclass(frozen=True, slots=True)
class Compact:
    """A compact type read: its schema, whether `?` made it optional, and its `= default`
    (NO_DEFAULT when none)."""

    schema: dict[str, Any]
    optional: bool = False
    default: Any = NO_DEFAULT


def read_compact(text: str) -> Compact:
    """`integer = 3`, `list[string]`, `string?`, `enum[a, b]`... as a JSON Schema.

    Raises:
        TypeSpellingError: the text is not a compact type.
    """
    cut = _top_level(text, "=")
    spelled, default_text = (text, "") if cut < 0 else (text[:cut], text[cut + 1:])
    eq = cut >= 0
    spelled = spelled.strip()
    optional = spelled.endswith("?")
    schema = _type(spelled.removesuffix("?").strip())
    default = NO_DEFAULT
    if eq:
        default = _default(default_text.strip(), schema)
    return Compact(schema, optional, default)


def _type(text: str, depth: int = 0) -> dict[str, Any]:
    if depth > MAX_TYPE_DEPTH:
        raise TypeSpellingError(f"the type nests more than {MAX_TYPE_DEPTH} levels deep")
    name_match = _NAME.match(text)
    if name_match is None:
        raise TypeSpellingError(f"'{text}' is not a type")
    name, rest = name_match.group(0), text[name_match.end():].strip()
    if not rest:
        if name in BASE_TYPES:
            return dict(BASE_TYPES[name])
        if name in ("dict", "enum"):
            raise TypeSpellingError(f"'{name}' takes arguments: {name}[...]")
        raise TypeSpellingError(_unknown(name))
    if not (rest.startswith("[") and rest.endswith("]")):
        if "?" in rest:
            raise TypeSpellingError("'?' (optional) goes at the end of the whole type")
        raise TypeSpellingError(f"unexpected '{rest}' after '{name}'")
    inner = rest[1:-1].strip()
    if name in ("list", "array") or _ALIASES.get(name) == "list":
        return {"type": "array", "items": _type(inner, depth + 1)}
    if name == "dict":
        return {"type": "object", "additionalProperties": _type(inner, depth + 1)}
    if name == "enum":
        values = [_enum_item(item) for item in _split(inner)]
        if not values or len(set(map(json.dumps, values))) != len(values):
            raise TypeSpellingError("enum[...] takes distinct values, at least one")
        return {"enum": values}
    if name in BASE_TYPES:
        raise TypeSpellingError(f"'{name}' takes no arguments")
    raise TypeSpellingError(_unknown(name))


def _unknown(name: str) -> str:
    alias = _ALIASES.get(name)
    hint = f"; did you mean '{alias}'?" if alias else "".join(
        "; " + note for note in suggest(name, (*BASE_TYPES, "dict", "enum")))
    return f"unknown type '{name}'{hint} (types: {', '.join(BASE_TYPES)}, list[T], dict[T], " \
           "enum[a, b])"


def _top_level(text: str, wanted: str, start: int = 0) -> int:
    """The offset of the first `wanted` character at or after `start` outside quotes and
    brackets, or -1."""
    depth, quote = 0, ""
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == wanted and depth == 0:
            return index
    return -1


def _split(text: str) -> list[str]:
    """Items separated by top-level commas (commas inside quotes or brackets stay)."""
    items, start = [], 0
    while (comma := _top_level(text, ",", start)) >= 0:
        items.append(text[start:comma].strip())
        start = comma + 1
    items.append(text[start:].strip())
    return [item for item in items if item]


def _enum_item(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _default(text: str, schema: dict[str, Any]) -> Any:
    """A default as strict JSON (qrun/jsonio.py: `1e999` is not infinity, an integer is at
    most 4,300 digits); bare text for a string or an enum of strings."""
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    try:
        return parse_value(text)
    except BadInput as exc:
        if schema.get("type") == "string" or "enum" in schema or not schema:
            return text
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise TypeSpellingError(f"the default '{shown}' is not a JSON value: {exc}") from None


# ---- declarations ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InputType:
    """One typed input: its JSON Schema (with `default` and `description` when given),
    whether a run must give it, and its default (NO_DEFAULT when none)."""

    name: str
    schema: dict[str, Any]
    required: bool
    default: Any = field(default=NO_DEFAULT, compare=False)

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT


def read_input_type(name: str, data: Any, entry: ast.FrontMatterEntry, fail: Fail
                    ) -> InputType | None:
    """The type of input `name` declared as `data` (a compact string, a JSON Schema mapping,
    or null for any value); None after reporting why it is not one."""
    path: tuple[str | int, ...] = (name,)
    if data is None:
        return InputType(name, {}, True)
    if isinstance(data, str):
        try:
            compact = read_compact(data)
        except TypeSpellingError as err:
            fail(f"input '{name}': {err}", entry.span_of(path), (_TABLE_NOTE,))
            return None
        schema = compact.schema
        if compact.default is not NO_DEFAULT:
            schema["default"] = compact.default
        declared = InputType(name, schema, not (compact.optional or compact.default
                                                is not NO_DEFAULT), compact.default)
    elif isinstance(data, dict):
        mapping = read_schema_mapping(data, entry, path, fail)
        if mapping is None:
            return None
        schema = mapping
        optional = schema.pop("optional", False)
        if not isinstance(optional, bool):
            fail(f"input '{name}': optional must be true or false",
                 entry.span_of((*path, "optional")), ())
            return None
        default = schema.get("default", NO_DEFAULT)
        declared = InputType(name, schema, not (optional or default is not NO_DEFAULT), default)
    else:
        fail(f"input '{name}': a type is a name such as string, integer = 3 or list[string], "
             f"or a JSON Schema mapping; got {json.dumps(data)}", entry.span_of(path),
             (_TABLE_NOTE,))
        return None
    if not schema_is_valid(declared.schema, entry, path, fail, f"input '{name}'"):
        return None
    if declared.has_default:
        problem = first_problem(declared.schema, declared.default)
        if problem is not None:
            fail(f"input '{name}': its default does not fit its type: {problem[1]}",
                 entry.span_of(path), ())
            return None
    return declared


_TABLE_NOTE = "types: docs/language.md §4.1 (string, integer = 3, list[string], string?...)"


def read_schema_mapping(data: dict[str, Any], entry: ast.FrontMatterEntry,
                        path: tuple[str | int, ...], fail: Fail) -> dict[str, Any] | None:
    """A JSON Schema written as a mapping; its `type` may be a compact spelling
    (`type: list[string]`), merged in."""
    schema = dict(data)
    spelled = schema.get("type")
    if isinstance(spelled, str) and spelled not in _SCHEMA_TYPES:
        try:
            compact = read_compact(spelled)
        except TypeSpellingError as err:
            fail(f"{_what(path)}: {err}", entry.span_of((*path, "type")), (_TABLE_NOTE,))
            return None
        if compact.optional or compact.default is not NO_DEFAULT:
            fail(f"{_what(path)}: write optional: true and default: here, not in type",
                 entry.span_of((*path, "type")), ())
            return None
        del schema["type"]
        schema = {**compact.schema, **schema}
    return schema


def _what(path: tuple[str | int, ...]) -> str:
    return f"input '{path[0]}'" if path else "output"


def schema_is_valid(schema: Any, entry: ast.FrontMatterEntry, path: tuple[str | int, ...],
                    fail: Fail, what: str) -> bool:
    """Whether `schema` is a JSON Schema (draft 2020-12's metaschema), after reporting where
    it is not. A simple schema is checked here (lang/simple_schema.py), any other by
    jsonschema."""
    if is_simple(schema):
        problem = schema_problem(schema)
        if problem is not None:
            fail(f"{what}: not a JSON Schema: {problem[1]}",
                 entry.span_of((*path, *problem[0])), ())
        return problem is None
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        inner = tuple(err.path)
        fail(f"{what}: not a JSON Schema: {err.message}", entry.span_of((*path, *inner)), ())
        return False
    return _refs_refused(schema, entry, path, fail, what)


_REFS = ("$ref", "$dynamicRef", "$recursiveRef")


def _refs_refused(schema: Any, entry: ast.FrontMatterEntry, path: tuple[str | int, ...],
                  fail: Fail, what: str) -> bool:
    """Whether `schema` has no reference, after reporting the first. A declared type is one
    property of the record's schema (Program.input_schema, output_schema), so a `$ref` in it
    resolves against that record, not against the type as written: `#/$defs/a` would point
    at nothing (an internal error at the run) or at another part of the record."""
    for pointer, sub in schema_positions(schema):
        key = next((k for k in _REFS if k in sub), None)
        if key is not None:
            inner = tuple(int(step) if step.isdigit() else
                          step.replace("~1", "/").replace("~0", "~")
                          for step in pointer.split("/")[1:])
            fail(f"{what}: {key} is not allowed in a declared type",
                 entry.span_of((*path, *inner, key), key=True),
                 ("write the referenced schema out where it is used (docs/language.md §4.1)",))
            return False
    return True


def first_problem(schema: Any, value: Any) -> Problem | None:
    """The path inside `value` and the message of the first way it does not fit `schema`
    (jsonschema's best match for a schema that is not simple), or None when it fits."""
    if is_simple(schema):
        return value_problem(schema, value)
    from jsonschema.exceptions import best_match

    error = best_match(_validator()(schema).iter_errors(value))
    if error is None:
        return None
    return tuple(error.absolute_path), error.message


@functools.cache
def _validator() -> Any:
    """jsonschema's draft 2020-12 validator, its `pattern` searched as a simple schema's is
    (simple_schema.pattern_problem: bounded in time; jsonschema's own uses `re`, unbounded)."""
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, expected: str, instance: Any, _: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string"):
            problem = pattern_problem(expected, instance)
            if problem is not None:
                yield ValidationError(problem)

    return validators.extend(Draft202012Validator, {"pattern": pattern})


def where(path: tuple[str | int, ...]) -> str:
    """` at ['tags'][0]`: a path inside a value, as lang/inputs.py writes it."""
    return " at " + "".join(f"[{step!r}]" for step in path) if path else ""


def object_schema(types: Mapping[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    """The schema of a record with these properties (inputs' or output's)."""
    schema: dict[str, Any] = {"type": "object", "properties": dict(types)}
    if required:
        schema["required"] = required
    return schema


_RECORD_KEYS = frozenset({"type", "properties", "required", "title", "description", "$comment",
                          "$schema", "examples", "default", "deprecated", "readOnly",
                          "writeOnly"})
"""The keywords a written-out `output:` may have at its top: lang/output.py proves each
property from its holes, and nothing more (a `minProperties` or `additionalProperties` there
is not proven)."""


def _record_is_plain(schema: dict[str, Any], entry: ast.FrontMatterEntry, fail: Fail) -> bool:
    plain = True
    for key in schema:
        if key not in _RECORD_KEYS:
            fail(f"output: '{key}' is not proven at the top of the record (a property's "
                 "schema may have it)", entry.span_of((key,), key=True),
                 ("the record's top takes type, properties and required "
                  "(docs/language.md §4.2)",))
            plain = False
    for index, name in enumerate(schema.get("required", ())):
        if name not in schema["properties"]:
            fail(f"output: required '{name}' is not one of its properties",
                 entry.span_of(("required", index)), ())
            plain = False
    return plain


def read_output(entry: ast.FrontMatterEntry, fail: Fail) -> dict[str, Any] | None:
    """`output:` as the JSON Schema of the result record: a JSON Schema of type object, or a
    mapping of capture names to types as `inputs:` has them (`?`: not required)."""
    data = entry.data
    if not isinstance(data, dict) or not data:
        fail("front matter 'output' must be a mapping of capture names to types, or a JSON "
             "Schema of type object", entry.value_span, ())
        return None
    if any(key in data for key in ("type", "properties", "$schema")):
        schema = dict(data)
        if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
            fail("front matter 'output' must be a JSON Schema of type object with "
                 "properties (one per capture)", entry.value_span, ())
            return None
        if not schema_is_valid(schema, entry, (), fail, "output"):
            return None
        return schema if _record_is_plain(schema, entry, fail) else None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spelled in data.items():
        path = (name,)
        if isinstance(spelled, str):
            try:
                compact = read_compact(spelled)
            except TypeSpellingError as err:
                fail(f"output '{name}': {err}", entry.span_of(path), (_TABLE_NOTE,))
                continue
            if compact.default is not NO_DEFAULT:
                fail(f"output '{name}': an output has no default", entry.span_of(path), ())
                continue
            properties[name], optional = compact.schema, compact.optional
        elif isinstance(spelled, dict):
            mapping = read_schema_mapping(spelled, entry, path, fail)
            if mapping is None:
                continue
            optional = bool(mapping.pop("optional", False))
            properties[name] = mapping
        else:
            fail(f"output '{name}': a type is a name such as string or a JSON Schema mapping",
                 entry.span_of(path), ())
            continue
        if schema_is_valid(properties[name], entry, path, fail, f"output '{name}'") \
                and not optional:
            required.append(name)
    return object_schema(properties, required)
