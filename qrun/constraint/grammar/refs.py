"""Keywords beside a `$ref` that llguidance 1.7 refuses when the reference is circular
("circular references with sibling keys are not supported") and that can go without
changing which instances are valid:

- In drafts 4, 6 and 7 a `$ref` replaces its whole subschema: the keywords beside it are
  ignored (draft-07 Core, section 8.3; the `jsonschema` validators for those drafts ignore
  them too). They are dropped, but for the annotations llguidance takes anyway, `$id`/`id`
  (they move the base `$ref`s resolve against), `definitions`/`$defs`, and any keyword
  another `$ref` points into (it would dangle).
- In 2019-09 and later the siblings apply beside the reference (an allOf; llguidance refuses
  `allOf: [{$ref}, {siblings}]` for a circular one too): a `type` the target already
  implies is dropped, which changes nothing.
- A `type` beside an `anyOf` whose branches (`$ref`s among them) each declare that
  type already is dropped in any draft (llguidance copies it into each branch).
"""

from __future__ import annotations

from typing import Any

from qrun.constraint.grammar.schema import (
    PROSE,
    pinned_keys,
    ref_targets,
    resolve,
    subschemas,
)

__all__ = ["drop_implied_type", "drop_ref_siblings"]

# Kept beside a `$ref` in every draft (see the module docstring).
_KEPT = frozenset({"$ref", "$schema", "$id", "id", "$anchor", "definitions", "$defs"})
# A chain of `$ref`s is followed this far to find the target's type.
_DEPTH = 3


def drop_ref_siblings(schema: dict[str, Any], draft: int, root: Any,
                      kept: dict[int, set[str]] | None = None,
                      positions: list[dict[str, Any]] | None = None) -> bool:
    """Drop, in place, the keywords beside `$ref`s in `schema` that say nothing there (see
    the module docstring). `root` is where local `$ref`s resolve, or None (not followed);
    `kept` and `positions` the document's pinned_keys and subschemas when the caller has
    them. Whether a dropped value was an object or a list (it may have held subschemas and
    `$ref`s)."""
    if kept is None:
        kept = pinned_keys(schema, ref_targets(schema))
    dropped_container = False
    for sub in subschemas(schema) if positions is None else positions:
        drop_implied_type(sub, root)
        if not isinstance(sub.get("$ref"), str) or not set(sub) - _KEPT:
            continue
        pointed = kept.get(id(sub), ())
        for key in [k for k in sub if k not in _KEPT and k not in pointed]:
            # prose goes in any draft: llguidance counts a `description` there as a sibling
            if draft in (4, 6, 7) or key in PROSE \
                    or (key == "type" and _implied(sub, root)):
                dropped_container |= isinstance(sub.pop(key), dict | list)
    return dropped_container


def _types(value: Any) -> set[str] | None:
    if isinstance(value, str):
        return {value}
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return set(value)
    return None


def _implied(sub: dict[str, Any], root: Any) -> bool:
    """Whether the `$ref` target of `sub` only takes values of a type `sub["type"]` lists."""
    wanted = _types(sub["type"])
    found = _type_of({"$ref": sub["$ref"]}, root, sub)
    return wanted is not None and found is not None and found <= _widened(wanted)


def _type_of(node: Any, root: Any, origin: Any) -> set[str] | None:
    """The types `node` (or the `$ref` target it is) declares, None when unknown."""
    for _ in range(_DEPTH):
        if not isinstance(node, dict) or node is origin:
            return None
        if "type" in node:
            return _types(node["type"])
        if root is None or not isinstance(node.get("$ref"), str):
            return None
        node = resolve(root, node["$ref"])
    return None


def _widened(types: set[str]) -> set[str]:
    return types | {"integer"} if "number" in types else types


def drop_implied_type(sub: dict[str, Any], root: Any) -> None:
    """Drop `sub`'s `type` where each of its `anyOf` branches declares it already
    (llguidance copies the `type` into each branch, and into a circular `$ref` refuses it;
    beside a `oneOf` it helps llguidance prove the branches disjoint: kept)."""
    branches = sub.get("anyOf")
    if branches is None or "$ref" in sub:  # most subschemas: no set built (called for each)
        return
    wanted = _types(sub.get("type"))
    if wanted is None:
        return
    if isinstance(branches, list) and branches and any(
            isinstance(b, dict) and "$ref" in b for b in branches):
        found = [_type_of(b, root, sub) for b in branches]
        if all(f is not None and f <= _widened(wanted) for f in found):
            del sub["type"]
