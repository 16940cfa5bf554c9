"""How many optional properties a JSON Schema lets come at one place, checked before llguidance
compiles it. llguidance's Earley parser holds about 4 items per optional property of an object
in the row where a key may start (4 x n + 7, measured: tests/constraint/grammar/
test_schema_size.py), summed over the `anyOf`/`oneOf` branches that may start at the same
place, and stops when a row outgrows its limit: an object of 10,000 optional properties passed
`--check` and then stopped the first hole that wrote `{"` ("Current row has 40007 items; max is
20000"). Properties `required` lists come one by one and cost nothing; nested objects are
places of their own. Pure Python over the user's schema, so the error has its JSON pointer."""

from __future__ import annotations

from typing import Any

from qrun.constraint.grammar.schema import escape, resolve, schema_positions

__all__ = ["crowded_place"]

_BRANCHES = ("anyOf", "oneOf", "allOf")


def crowded_place(schema: Any, limit: int) -> tuple[str, int] | None:
    """The JSON pointer of the first subschema at which more than `limit` optional properties
    may come, and how many, or None."""
    for pointer, sub in schema_positions(schema):
        count = _optional_here(schema, sub, set())
        if count > limit:
            return _where(pointer, sub), count
    return None


def _optional_here(root: Any, sub: Any, seen: set[int]) -> int:
    """Optional properties of the objects that may start where `sub` does: its own, and those
    of its `anyOf`/`oneOf`/`allOf` members and `$ref` target (each followed once)."""
    if not isinstance(sub, dict) or id(sub) in seen:
        return 0
    seen.add(id(sub))
    count = 0
    properties = sub.get("properties")
    if isinstance(properties, dict):
        required = sub.get("required")
        # Names only: a hostile `required` may hold lists (unhashable) or numbers.
        listed = ({name for name in required if isinstance(name, str)}
                  if isinstance(required, list) else set())
        count += sum(1 for name in properties if name not in listed)
    for key in _BRANCHES:
        members = sub.get(key)
        if isinstance(members, list):
            count += sum(_optional_here(root, member, seen) for member in members)
    ref = sub.get("$ref")
    if isinstance(ref, str):
        count += _optional_here(root, resolve(root, ref), seen)
    return count


def _where(pointer: str, sub: dict[str, Any]) -> str:
    """The pointer to report: the object's `properties` when they are its own, else the
    subschema (whose branches or `$ref` bring them)."""
    own = sub.get("properties")
    if isinstance(own, dict) and not any(isinstance(sub.get(k), list) for k in _BRANCHES) \
            and not isinstance(sub.get("$ref"), str):
        return f"{pointer}/{escape('properties')}"
    return pointer
