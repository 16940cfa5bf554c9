"""Finite subschemas as plain enums: a subschema whose values are drawn from a finite list (its
`enum` or `const`, type null or boolean, a short integer range, arrays of distinct items from
a finite list under `uniqueItems`, an `allOf` member's, a `$ref`'s target's, or every branch
of an `anyOf` or `oneOf` being one) becomes `{"enum": [the values of that list the whole
subschema accepts]}`. The set of valid instances is kept exactly, and keywords llguidance
refuses (`not`, overlapping `oneOf`, `uniqueItems`, `if`...) go with the rest. MaskBench's
`allOf: [{enum}, {not ...}]` schemas are of this kind, and its `uniqueItems` lists of
options.

Each value is judged by the `jsonschema` validator (the reference the suite and
tests/constraint/grammar/test_rewrite.py check against) for the schema's draft, with every
format it knows asserted; a document that names a format it does not know, or a subschema it
cannot evaluate (a `$ref` outside the document, a pattern Python cannot read) stays as
written. `jsonschema` is imported on the first such subschema only (60 ms).
"""

from __future__ import annotations

import json
from typing import Any

from qrun.constraint.grammar.negation import ANNOTATIONS
from qrun.constraint.grammar.schema import (
    pointed_below,
    ref_targets,
    resolve,
    schema_positions,
    subschemas,
)

__all__ = ["FILTERED", "document_validator", "filter_finite"]

# Keys kept beside the filtered enum: annotations and what `$ref`s elsewhere may point into.
_KEPT = ANNOTATIONS | {"$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary"}
# Keywords llguidance refuses (or takes only in some forms): a finite subschema is filtered
# when one of them is in it, or in what its `$ref`s point at. Others (`{"type": "string",
# "enum": [...]}`) compile as written and are left alone: no validator run.
_REFUSED = frozenset({
    "not", "oneOf", "if", "then", "else", "uniqueItems", "contains", "minContains",
    "maxContains", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
    "unevaluatedItems", "dependencies", "dependentRequired", "dependentSchemas"})
# Values judged per subschema at most (each is one validator run, ~20 µs): the bound on the
# arrays `uniqueItems` over an enum is enumerated into (4 options: 65 arrays; 6: 1,957).
_MAX_VALUES = 1_000
FILTERED = _REFUSED
"""The keywords that make a finite subschema worth filtering: a document with none of them
anywhere is left alone (rewrite.py skips the walk)."""
# An integer range at most this long is a finite list.
_MAX_RANGE = 64
# A subschema of only these keys is an enum already (or no finite one).
_SIMPLE = _KEPT | {"enum", "const", "type"}
_FINITE_TYPES = {"null": (None,), "boolean": (False, True)}
# _finite_values finds a list only in a subschema with one of these keys, or of these types.
_FINITE_KEYS = frozenset({"const", "enum", "allOf", "$ref", "anyOf", "oneOf"})
_FINITE_TYPED = frozenset({*_FINITE_TYPES, "integer", "array"})  # ranges, uniqueItems
_REF_DEPTH = 4


def filter_finite(out: dict[str, Any], original: dict[str, Any], draft: int,
                  positions: list[dict[str, Any]] | None = None) -> bool:
    """Replace, in `out` (a copy of `original`, the document `draft` reads), each finite
    subschema holding one of `_REFUSED` by the enum of its valid values; whether any was.
    `positions`: the subschemas of `out`, where the caller has them."""
    # Most documents have no such subschema: the walk with pointers (and the validator) is
    # for those that do.
    if not any(_filtered_values(sub, out) is not None
               for sub in (subschemas(out) if positions is None else positions)):
        return False
    originals: dict[str, dict[str, Any]] = {}
    targets: set[str] = set()
    validator: Any = None
    changed = False
    for pointer, sub in schema_positions(out):
        values = _filtered_values(sub, out)
        if values is None:
            continue
        if validator is None:  # the first candidate: most schemas have none
            if _unknown_format(original):
                return changed
            validator = document_validator(original, draft)
            originals = dict(schema_positions(original))
            targets = ref_targets(out)
        removed = [key for key in sub if key not in _KEPT]
        if pointer not in originals or pointed_below(targets, pointer, removed):
            continue
        try:
            check = validator.evolve(schema=originals[pointer])
            kept = [v for v in values if check.is_valid(v)]
        except Exception:  # noqa: BLE001 -- any failure to evaluate leaves it as written
            continue
        for key in removed:
            del sub[key]
        sub["enum"] = _unique(kept)
        changed = True
    return changed


def _filtered_values(sub: dict[str, Any], root: Any) -> list[Any] | None:
    """The values `sub` is drawn from when it is to be filtered (finite, not too many, and
    holding a keyword of _REFUSED), else None."""
    if _SIMPLE.issuperset(sub) or (_FINITE_KEYS.isdisjoint(sub)
                                   and _typed(sub) not in _FINITE_TYPED):
        return None  # most subschemas: no finite list, found without following anything
    values = _finite_values(sub, root, 0)
    if values is None or len(values) > _MAX_VALUES or not _refused_in(sub, root):
        return None
    return values


def _typed(sub: dict[str, Any]) -> str | None:
    """The one type `sub` declares, or None."""
    declared = sub.get("type")
    if isinstance(declared, list) and len(declared) == 1:
        declared = declared[0]
    return declared if isinstance(declared, str) else None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _distinct_sequences(sub: dict[str, Any], root: Any, depth: int) -> list[Any] | None:
    """Every array of distinct values of `sub`'s finite `items`, within its length bounds,
    when there are at most _MAX_VALUES of them (`uniqueItems` on an enum: MaskBench's lists
    of options)."""
    import itertools
    import math

    if any(key in sub for key in ("prefixItems", "additionalItems", "contains")):
        return None
    items = _finite_values(sub.get("items", True), root, depth + 1)
    if items is None:
        return None
    items = _unique(items)
    shortest = sub.get("minItems", 0)
    longest = sub.get("maxItems", len(items))
    if not (_whole(shortest) and _whole(longest)):
        return None
    longest = min(longest, len(items))
    lengths = range(max(shortest, 0), longest + 1)
    if sum(math.perm(len(items), k) for k in lengths) > _MAX_VALUES:
        return None
    return [list(seq) for k in lengths for seq in itertools.permutations(items, k)]


def _refused_in(sub: dict[str, Any], root: Any) -> bool:
    """Whether a keyword of `_REFUSED` is in `sub` or in a subschema a `$ref` in it points
    at (one level of `$ref`)."""
    targets = []
    for _, inner in schema_positions(sub):
        if set(inner) & _REFUSED:
            return True
        if isinstance(inner.get("$ref"), str):
            targets.append(resolve(root, inner["$ref"]))
    return any(set(inner) & _REFUSED for target in targets
               for _, inner in schema_positions(target))


def _finite_values(sub: Any, root: Any, depth: int) -> list[Any] | None:
    """A finite list holding every value `sub` accepts (maybe more), or None."""
    if sub is False:
        return []
    if not isinstance(sub, dict) or depth > _REF_DEPTH:
        return None
    if "const" in sub:
        return [sub["const"]]
    if isinstance(sub.get("enum"), list):
        return list(sub["enum"])
    typed = _typed(sub)
    if typed in _FINITE_TYPES:
        return list(_FINITE_TYPES[typed])
    if typed == "integer":
        low, high = sub.get("minimum"), sub.get("maximum")
        if isinstance(low, int) and isinstance(high, int) and _whole(low) and _whole(high) \
                and high - low < _MAX_RANGE:
            return list(range(low, high + 1))
    if typed == "array" and sub.get("uniqueItems") is True:
        return _distinct_sequences(sub, root, depth)
    for member in sub.get("allOf", []) if isinstance(sub.get("allOf"), list) else []:
        found = _finite_values(member, root, depth + 1)
        if found is not None:
            return found
    if isinstance(sub.get("$ref"), str):
        found = _finite_values(resolve(root, sub["$ref"]), root, depth + 1)
        if found is not None:
            return found
    for key in ("anyOf", "oneOf"):
        branches = sub.get(key)
        if isinstance(branches, list) and branches:
            lists = [_finite_values(b, root, depth + 1) for b in branches]
            if all(found is not None for found in lists):
                return [v for found in lists if found is not None for v in found]
    return None


def _unknown_format(schema: dict[str, Any]) -> bool:
    """Whether the document names a format the validator does not check (a value could not
    be judged by it: the schema is left to the format rules of rewrite.py)."""
    from jsonschema import FormatChecker

    known = FormatChecker().checkers
    return any(sub.get("format") not in known for _, sub in schema_positions(schema)
               if "format" in sub)


def document_validator(original: dict[str, Any], draft: int) -> Any:
    """A `jsonschema` validator of `draft` for the document `original` (its `$ref`s resolve
    in it; `.evolve(schema=sub)` checks a subschema of it)."""
    import jsonschema
    from jsonschema_specifications import REGISTRY  # the metaschemas; retrieves nothing

    cls = {3: jsonschema.Draft3Validator, 4: jsonschema.Draft4Validator,
           6: jsonschema.Draft6Validator, 7: jsonschema.Draft7Validator,
           2019: jsonschema.Draft201909Validator}.get(draft, jsonschema.Draft202012Validator)
    return cls(original, registry=REGISTRY, format_checker=jsonschema.FormatChecker())


def _unique(values: list[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for value in values:
        key = json.dumps(value, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out
