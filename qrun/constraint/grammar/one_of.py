"""`oneOf` as an `anyOf` of disjoint branches. llguidance takes a `oneOf` only where it sees
its branches cannot overlap; an `anyOf` it always takes, but an `anyOf` accepts a value two
branches match, which `oneOf` refuses. So the rewrite is the exact identity

    oneOf[B1..Bn] = anyOf[B1 ∧ ¬Bj for every j ≠ 1 .., Bn ∧ ¬Bj for every j ≠ n]

where ¬Bj (negation.py) is left out for each pair proven disjoint here (different types,
different constants, a property both require with disjoint values, one closed object
forbidding a property the other requires), and the `oneOf` is left as written when a needed
¬Bj has no form (llguidance then refuses it, or proves it disjoint itself). Between two
closed objects, "a property only Bi lists" stands in Bi for "a property Bj does not list",
which has no form. The branches of the `anyOf` are disjoint by construction, so it accepts
exactly what the `oneOf` did.
"""

from __future__ import annotations

from typing import Any

from qrun.constraint.grammar.negation import TYPES, negate
from qrun.constraint.grammar.schema import resolve

__all__ = ["disjoint_one_of"]

# Branches beyond this many stay as written: each branch carries up to n - 1 complements.
_MAX_BRANCHES = 12
_REF_DEPTH = 4


def disjoint_one_of(sub: dict[str, Any], root: Any) -> bool:
    """Replace `sub`'s `oneOf` by the `anyOf` above where every complement it needs has a
    form. `root` is the document `$ref`s resolve in (None: not followed). Whether it wrote a
    complement (negate() may write a `pattern`: rewrite.py then fixes the patterns)."""
    branches = sub.get("oneOf")
    if not isinstance(branches, list) or not 2 <= len(branches) <= _MAX_BRANCHES:
        return False
    if not isinstance(sub.get("allOf", []), list):
        return False
    context = _types(sub, root, 0)
    shapes = [_deref(b, root) for b in branches]
    overlapping = [[j for j in range(len(branches)) if j != i
                    and not _disjoint(shapes[i], shapes[j], context, root)]
                   for i in range(len(branches))]
    disjoint = []
    for i, branch in enumerate(branches):
        others = [_complement(shapes[j], shapes[i], root) for j in overlapping[i]]
        if any(other is None for other in others):
            return False
        disjoint.append({"allOf": [branch, *others]} if others else branch)
    # In the `oneOf`'s place: llguidance lays out an object's properties in the order it
    # meets them, so the keyword order is kept (beside an `anyOf`, it joins the `allOf`).
    merged = "anyOf" in sub
    items: list[tuple[str, Any]] = []
    for key, value in sub.items():
        if key == "oneOf":
            items.append(("allOf", [*sub.get("allOf", []), {"anyOf": disjoint}]) if merged
                         else ("anyOf", disjoint))
        elif not (merged and key == "allOf"):
            items.append((key, value))
    sub.clear()
    sub.update(items)
    return any(overlapping)


def _complement(other: Any, mine: Any, root: Any) -> Any:
    """A schema that, among the values of `mine`, holds exactly those `other` refuses; None
    when there is none here. negate() where it has a form; else, where both are closed
    objects (`additionalProperties: false`), "a listed property `other` refuses, or a
    property `mine` lists and `other` does not": "a property nobody lists" has no form, but
    `mine` admits none."""
    found = negate(other, root)
    if found is not None:
        return found
    if not (_closed(other) and _closed(mine)):
        return None
    listed = _properties(other)
    refused = negate({k: v for k, v in other.items() if k != "additionalProperties"}, root)
    if refused is None:
        return None
    extra = [{"required": [name]} for name in _properties(mine) if name not in listed]
    return {"anyOf": [refused, *extra]} if extra else refused


def _closed(schema: Any) -> bool:
    return (isinstance(schema, dict) and schema.get("additionalProperties") is False
            and "patternProperties" not in schema)


def _deref(schema: Any, root: Any) -> Any:
    """`schema` or, while it is a bare local `$ref`, what it points at."""
    for _ in range(_REF_DEPTH):
        if (root is None or not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str)
                or len(schema) != 1):
            return schema
        target = resolve(root, schema["$ref"])
        if target is None:
            return schema
        schema = target
    return schema


def _types(schema: Any, root: Any, depth: int) -> frozenset[str]:
    """The JSON types `schema` may accept ("integer" counted as "number"), all when unknown."""
    schema = _deref(schema, root)
    if schema is False:
        return frozenset()
    every = frozenset(TYPES)
    if not isinstance(schema, dict):
        return every
    found = every
    declared = schema.get("type")
    if isinstance(declared, str):
        declared = [declared]
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        found = frozenset("number" if t == "integer" else t for t in declared) & every
    values = _values(schema)
    if values is not None:
        found &= frozenset(_type_of(v) for v in values)
    if isinstance(schema.get("allOf"), list) and depth < _REF_DEPTH:
        for member in schema["allOf"]:
            found &= _types(member, root, depth + 1)
    return found


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"


def _values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _same(a: Any, b: Any) -> bool:
    """JSON equality (1 = 1.0, true ≠ 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and _type_of(a) == _type_of(b)


def _disjoint(a: Any, b: Any, context: frozenset[str], root: Any, depth: int = 0) -> bool:
    """Whether no value of the `context` types is valid against both `a` and `b` (False when
    not proven)."""
    a, b = _deref(a, root), _deref(b, root)
    if not (_types(a, root, 0) & _types(b, root, 0) & context):
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not any(_same(x, y) for x in va for y in vb):
        return True
    if context & _types(a, root, 0) & _types(b, root, 0) != {"object"} or depth >= _REF_DEPTH:
        return False
    # Objects only from here: a property both require with disjoint values, or one that one
    # requires and the other forbids.
    for first, second in ((a, b), (b, a)):
        required = _required(first)
        props = _properties(second)
        closed = second.get("additionalProperties") is False and "patternProperties" not in second
        for name in required:
            if props.get(name) is False or (closed and name not in props):
                return True
            if name in _required(second):
                ours = _properties(first).get(name, True)
                if _disjoint(ours, props.get(name, True), frozenset(TYPES), root, depth + 1):
                    return True
    return False


def _required(schema: dict[str, Any]) -> list[str]:
    names = schema.get("required")
    if isinstance(names, list):
        return [n for n in names if isinstance(n, str)]
    return []


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}
