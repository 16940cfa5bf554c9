"""JSON Schema documents as data: every subschema with its JSON pointer, local `$ref`s resolved,
the draft a schema declares, numbers JSON cannot carry, and the closed-object option (objects
that list their properties forbid others). Shared by the rewrite pass (rewrite.py) and the
error locator (grammar.py); pure Python, no llguidance."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

__all__ = [
    "close_objects",
    "copy_json",
    "draft_of",
    "Survey",
    "escape",
    "non_finite",
    "pinned_keys",
    "pointed_below",
    "pointer_target",
    "ref_targets",
    "resolve",
    "schema_positions",
    "subschemas",
    "survey",
]

PROSE = frozenset({"$comment", "title", "description", "default", "examples", "example",
                   "readOnly", "writeOnly", "deprecated", "markdownDescription"})
"""Annotations that are text or examples: they never change which instances are valid, and
`$ref`s resolve without them (unlike `$schema`, `$id` or `$anchor`). refs.py drops them beside
a `$ref`, rewrite.py from every subschema before llguidance reads it."""

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas (every
# draft's; `items` may be either form, `dependencies` maps to schemas or to name lists).
_SCHEMA_VALUED = (
    "not", "if", "then", "else", "items", "additionalItems", "additionalProperties",
    "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = (
    "properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
    "dependencies",
)


def schema_positions(schema: Any, pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema object in `schema` with its JSON pointer, parents first. Only keyword
    positions are walked: a property named "not" is a name, not a keyword, and values of
    `enum`, `const` or `default` are data. (A stack, not recursion: this walk runs several
    times per schema on the way to its first mask.)"""
    stack: list[tuple[str, Any]] = [(pointer, schema)]
    while stack:
        at, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield at, node
        children: list[tuple[str, Any]] = []
        for key, value in node.items():
            if key in _SCHEMA_VALUED and isinstance(value, dict):
                children.append((f"{at}/{escape(key)}", value))
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                here = f"{at}/{escape(key)}"
                children.extend((f"{here}/{i}", item) for i, item in enumerate(value))
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                here = f"{at}/{escape(key)}"
                children.extend((f"{here}/{escape(name)}", item)
                                for name, item in value.items())
        stack.extend(reversed(children))


def subschemas(schema: Any) -> list[dict[str, Any]]:
    """The subschema objects of schema_positions, in its order, without their pointers (the
    cheaper walk, where no pointer is needed)."""
    found: list[dict[str, Any]] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        found.append(node)
        children: list[Any] = []
        for key, value in node.items():
            if key in _SCHEMA_VALUED and isinstance(value, dict):
                children.append(value)
            elif (key in _SCHEMA_LISTS and isinstance(value, list)) or (
                    key in _SCHEMA_MAPS and isinstance(value, dict)):
                children.extend(value.values() if isinstance(value, dict) else value)
        stack.extend(reversed(children))
    return found


def copy_json(value: Any) -> Any:
    """A copy of JSON data, each dict and list new (several times faster than
    copy.deepcopy, which keeps a memo of every object; a value that holds itself recurses
    until RecursionError, which the callers' checks report first)."""
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    return value


def escape(key: str) -> str:
    """A name as one JSON pointer segment (RFC 6901)."""
    key = str(key)
    if "~" in key or "/" in key:
        return key.replace("~", "~0").replace("/", "~1")
    return key


def resolve(root: Any, ref: str) -> Any:
    """The subschema a local `$ref` ("#/$defs/a", "#") points at, or None when it points
    nowhere (or is not a local JSON pointer)."""
    if not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
        return None
    parts = ref[2:].split("/") if len(ref) > 1 else []
    return pointer_target(root, (re.sub(r"%([0-9A-Fa-f]{2})",
                                        lambda m: chr(int(m.group(1), 16)), part)
                                 if "%" in part else part for part in parts))


def pointer_target(root: Any, parts: Iterable[str]) -> Any:
    """The node the JSON pointer segments `parts` (still ~-escaped, RFC 6901) lead to from
    `root`, or None when one of them leads nowhere."""
    node = root
    for part in parts:
        if "~" in part:
            part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def ref_targets(schema: Any, positions: list[dict[str, Any]] | None = None) -> set[str]:
    """The JSON pointers the document's local `$ref`s point at, %-decoded as resolve() reads
    them. `positions`: the document's subschemas, where the caller has them."""
    return {unquote(sub["$ref"][1:])
            for sub in (subschemas(schema) if positions is None else positions)
            if isinstance(sub.get("$ref"), str) and sub["$ref"].startswith("#")}


def pointed_below(targets: set[str], pointer: str, keys: Iterable[str]) -> bool:
    """Whether one of `targets` (ref_targets) lies below one of `keys` of the subschema at
    `pointer`: a rewrite that removes those keys would leave that `$ref` dangling."""
    prefix = pointer + "/"
    names = {escape(key) for key in keys}
    return any(t.startswith(prefix) and t[len(prefix):].split("/")[0] in names
               for t in targets)


def pinned_keys(document: Any, targets: set[str]) -> dict[int, set[str]]:
    """Per object of `document` (by id) its keys below which one of `targets` (ref_targets)
    lies: what pointed_below finds at each subschema, without the walk's pointers."""
    found: dict[int, set[str]] = {}
    for target in targets:
        node = document
        for part in target.split("/")[1:]:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                found.setdefault(id(node), set()).add(key)
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                break
    return found


def draft_of(schema: Any) -> int:
    """The draft a schema declares in `$schema` as a number (3, 4, 6, 7, 2019, 2020);
    2020 when it declares none or one qrun does not know (llguidance reads 2020-12)."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(declared, str):
        for marker, draft in (("draft-03", 3), ("draft-04", 4), ("draft-06", 6),
                              ("draft-07", 7), ("2019-09", 2019)):
            if marker in declared:
                return draft
    return 2020


def non_finite(value: Any, pointer: str = "") -> str | None:
    """The JSON pointer of the first number JSON cannot write (Infinity, NaN) anywhere in
    `value`, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return pointer
    items: Any = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, item in items:
        found = non_finite(item, f"{pointer}/{escape(str(key))}")
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Survey:
    """What one walk over a whole JSON document finds, so that the checks and rewrites that
    cannot apply to it are skipped (most of a large schema's time to its first mask was
    walks that found nothing: issue #24 item 4).

    `keys`: every object key anywhere in the document, so a superset of the keywords its
    subschemas use (a property named "not" counts too: a superset only costs a walk).
    `non_finite`: some float is Infinity or NaN. `optional_properties`: the optional
    properties of every object that lists `properties`, summed over the document: no place
    of a value can have more (schema_size.py counts each object once per place)."""

    keys: frozenset[str]
    non_finite: bool
    optional_properties: int


def survey(document: Any) -> Survey | None:
    """One walk over every value of `document` (a stack: no recursion limit); None where it
    is not plain JSON data (a container that comes twice, shared or inside itself; a type
    other than dict, list, str, int, float, bool and None): the full checks then say what."""
    if type(document) is not dict and type(document) is not list:
        return None
    keys: set[str] = set()
    optional = 0
    finite = True
    seen: set[int] = set()
    stack: list[Any] = [document]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            return None
        seen.add(id(node))
        if type(node) is dict:
            keys.update(node)
            properties = node.get("properties")
            if type(properties) is dict:
                required = node.get("required")
                listed = {n for n in required if type(n) is str} \
                    if type(required) is list else ()
                optional += sum(1 for name in properties if name not in listed)
            values: Any = node.values()
        else:
            values = node
        for value in values:
            kind = type(value)
            if kind is dict or kind is list:
                stack.append(value)
            elif kind is float:
                finite = finite and math.isfinite(value)
            elif kind not in _SCALARS:
                return None
    return Survey(frozenset(keys), not finite, optional)


_SCALARS = frozenset({str, int, bool, type(None)})


def close_objects(schema: Any) -> Any:
    """A copy of `schema` in which every object schema that lists its properties (in
    `properties` or `patternProperties`) and says nothing about other ones forbids them:
    qrun's closed-object option (docs/language.md §7.4). Members of `allOf`, and schemas
    merged with others (`allOf`/`anyOf`/`oneOf`/`$ref` beside them), stay open: closing one
    would forbid the properties the others add."""
    out = copy.deepcopy(schema)
    for pointer, sub in schema_positions(out):
        listed = "properties" in sub or "patternProperties" in sub
        merged = re.search(r"/allOf/\d+$", pointer) is not None or any(
            k in sub for k in ("allOf", "anyOf", "oneOf", "$ref"))
        if listed and not merged and "additionalProperties" not in sub:
            sub["additionalProperties"] = False
    return out
