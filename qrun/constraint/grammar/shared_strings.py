"""Repeated pattern strings written once: a string subschema with a `pattern` or `format` that
appears in several places of a document (the same `"format": "date-time"` on every timestamp
property, a formats.py pattern on each `uri-reference`) moves to one `$defs` entry of the
root, and each place becomes a `$ref` to it. Same instances: a `$ref` alone is its target.

Why: llguidance builds a lexeme for each place a pattern appears, and the build of a large
pattern is most of a schema's compile. Five properties with the `regex` format compile in
78 ms written out and in 16 ms through one `$ref` (one compiles in 15 ms); `uri-reference`
8.7 against 2.5 ms (issue #24 item 4; tests/constraint/grammar/test_shared_strings.py checks
the instances against `jsonschema`).

Only where a `$ref` is plainly its target: not below `oneOf` (llguidance proves branches
disjoint only when it sees their content), `allOf`, `not`, `if`/`then`/`else` or other
keywords it reasons about, and not in a document whose `$id`s below the root change the
base of `$ref`s (rewrite.py leaves those alone too)."""

from __future__ import annotations

import json
from typing import Any

from qrun.constraint.grammar.schema import copy_json

__all__ = ["share_strings"]

# A subschema made only of these keys (and with a pattern or format) is a shared string.
_LEAF_KEYS = frozenset({"type", "pattern", "format", "minLength", "maxLength"})
# Keyword positions walked: a $ref at a place under these means its target. Other keywords
# (oneOf, allOf, not, if, contains, propertyNames, dependencies...) are not walked.
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SINGLE = ("items", "additionalProperties", "additionalItems")
_LISTS = ("anyOf", "prefixItems", "items")
_PREFIX = "qrun-shared-"


def share_strings(root: dict[str, Any], kept: dict[int, set[str]]) -> bool:
    """Move each string subschema of `root` that appears (as equal JSON) in two places or more
    to a new entry of root's `$defs`, each place becoming a `$ref` to it; whether any moved.
    `kept`: schema.pinned_keys of `root` (a subschema a `$ref` points into stays)."""
    defs = root.get("$defs", {})
    if not isinstance(defs, dict):
        return False
    places: dict[str, list[dict[str, Any]]] = {}
    stack: list[dict[str, Any]] = [root]
    while stack:
        for child in _children(stack.pop()):
            stack.append(child)
            if _is_pattern_string(child) and id(child) not in kept:
                text = json.dumps(child, sort_keys=True, ensure_ascii=False)
                places.setdefault(text, []).append(child)
    shared = [found for found in places.values() if len(found) > 1]
    if not shared:
        return False
    taken = set(defs)
    number = 0
    for found in shared:
        while f"{_PREFIX}{number}" in taken:
            number += 1
        name = f"{_PREFIX}{number}"
        taken.add(name)
        defs[name] = copy_json(found[0])
        for place in found:  # in place: a `$ref` that points at the place still does
            place.clear()
            place["$ref"] = f"#/$defs/{name}"
    root["$defs"] = defs
    return True


def _is_pattern_string(node: dict[str, Any]) -> bool:
    return (node.keys() <= _LEAF_KEYS and ("pattern" in node or "format" in node)
            and (node.get("type") == "string" or (isinstance(node.get("type"), list)
                                                   and "string" in node["type"])))


def _children(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The subschema objects right below `node` at the walked keywords."""
    found: list[dict[str, Any]] = []
    for key, value in node.items():
        if key in _MAPS and isinstance(value, dict):
            found.extend(child for child in value.values() if isinstance(child, dict))
        elif key in _SINGLE and isinstance(value, dict):
            found.append(value)
        elif key in _LISTS and isinstance(value, list):
            found.extend(child for child in value if isinstance(child, dict))
    return found
