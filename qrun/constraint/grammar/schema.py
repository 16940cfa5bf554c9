"""JSON Schema documents as data: every subschema with its JSON pointer, local `$ref`s resolved,
the draft a schema declares, numbers JSON cannot carry, and the closed-object option (objects
that list their properties forbid others). Shared by the rewrite pass (rewrite.py) and the
error locator (grammar.py); pure Python, no llguidance."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

__all__ = [
    "close_objects",
    "copy_json",
    "draft_of",
    "escape",
    "non_finite",
    "pinned_pointers",
    "pointed_below",
    "pointer_target",
    "ref_targets",
    "resolve",
    "schema_positions",
    "subschemas",
]

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
                                 for part in parts))


def pointer_target(root: Any, parts: Iterable[str]) -> Any:
    """The node the JSON pointer segments `parts` (still ~-escaped, RFC 6901) lead to from
    `root`, or None when one of them leads nowhere."""
    node = root
    for part in parts:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def ref_targets(schema: Any) -> set[str]:
    """The JSON pointers the document's local `$ref`s point at, %-decoded as resolve() reads
    them."""
    return {unquote(sub["$ref"][1:]) for sub in subschemas(schema)
            if isinstance(sub.get("$ref"), str) and sub["$ref"].startswith("#")}


def pointed_below(targets: set[str], pointer: str, keys: Iterable[str]) -> bool:
    """Whether one of `targets` (ref_targets) lies below one of `keys` of the subschema at
    `pointer`: a rewrite that removes those keys would leave that `$ref` dangling."""
    prefix = pointer + "/"
    names = {escape(key) for key in keys}
    return any(t.startswith(prefix) and t[len(prefix):].split("/")[0] in names
               for t in targets)


def pinned_pointers(targets: set[str], keys: Iterable[str]) -> set[str]:
    """The pointers of the subschemas below one of whose `keys` one of `targets`
    (ref_targets) lies: removing that key there would leave a `$ref` dangling."""
    names = {escape(key) for key in keys}
    found: set[str] = set()
    for target in targets:
        parts = target.split("/")
        found.update("/".join(parts[:i]) for i in range(1, len(parts)) if parts[i] in names)
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
