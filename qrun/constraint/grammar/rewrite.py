"""The sound rewrite of a JSON Schema before llguidance compiles it (grammar.py): forms
llguidance 1.7 refuses are turned into equivalent ones it takes. Each rewrite keeps the set
of valid instances exactly, or (where said) makes it smaller, so no invalid instance gets
through (tests/constraint/test_llg_rewrite.py checks each against the `jsonschema`
validator):

- `format` is asserted whatever the schema's draft (formats.py says how: llguidance's own
  format, a `pattern` qrun writes, or both where llguidance's is looser than the `jsonschema`
  checker: year 0000, February 29 of common years, leap seconds, hostnames over 253
  characters). A written pattern beside the subschema's own `pattern` goes into an `allOf`
  (both hold). With `formats="annotation"` every format is dropped (JSON Schema Validation
  2020-12 section 7.2 makes `format` an annotation by default), with `formats="known"` the
  unknown ones are; with the default "assert" an unknown one stays for llguidance to refuse
  (grammar/text.py check_schema names it and its pointer first).
- `not` of the forms that say "this property is absent" (`required`, `required` with
  `type: object`, `anyOf` of `required`), of `type`, and of `{}`/`true`/`false`.
- `dependencies`, `dependentRequired` and `dependentSchemas` become `anyOf` pairs ("absent,
  or present with its dependencies").
- `oneOf` branches that are local `$ref`s are inlined (llguidance proves branches disjoint
  only when it sees their content); a one-branch `oneOf` is that branch.
- No-op keywords llguidance refuses anyway (`uniqueItems: false`, `minProperties: 0`...).

Not rewritten (and so refused by llguidance with its reason): `uniqueItems: true`, `if`,
`contains`, `propertyNames`, `not` of anything else, unprovable `oneOf`.
"""

from __future__ import annotations

import copy
from typing import Any

from qrun.constraint.grammar.formats import assertion
from qrun.constraint.grammar.schema import draft_of, resolve, schema_positions

__all__ = ["rewrite"]

_TYPES = ("null", "boolean", "object", "array", "number", "string")
# Keywords that never change which instances are valid.
_ANNOTATIONS = frozenset({"$schema", "$id", "id", "$comment", "title", "description",
                          "default", "examples", "example", "readOnly", "writeOnly",
                          "deprecated", "$anchor"})
# A document with `$id`s below its root changes the base of `$ref`s inside them: its refs
# are not inlined (they would resolve against the wrong base).
_IDS = ("$id", "id")
# Inlining follows a chain of `$ref`s at most this far.
_INLINE_DEPTH = 3
# dependencies become one `anyOf` pair each inside one allOf; llguidance multiplies the pairs
# out, so more than this many stay as written (and are refused).
_MAX_DEPENDENCIES = 6


def rewrite(schema: Any, formats: str = "assert") -> Any:
    """A copy of `schema` that llguidance compiles more often and that accepts the same
    instances (or fewer where the module docstring says so); non-objects come back as they
    are. `formats` is a formats.MODES value: how `format` keywords are read."""
    if not isinstance(schema, dict):
        return schema
    out = copy.deepcopy(schema)
    draft = draft_of(out)
    positions = [sub for _, sub in schema_positions(out)]
    for sub in positions:
        _formats(sub, draft, formats)
        _no_ops(sub)
        _negation(sub)
        _dependencies(sub)
    inline = not any(key in sub for sub in positions[1:] for key in _IDS
                     if isinstance(sub.get(key), str))
    for sub in positions:
        _one_of(sub, out, inline)
    return out


def _formats(sub: dict[str, Any], draft: int, mode: str) -> None:
    """Assert `sub`'s format as formats.py says; drop it as an annotation (mode
    "annotation", or an unknown format in mode "known"). An unknown format in mode "assert"
    stays, for llguidance to refuse (check_schema names it first)."""
    if "format" not in sub:
        return
    how = assertion(sub["format"], draft) if isinstance(sub["format"], str) else None
    if mode == "annotation" or (how is None and mode == "known"):
        del sub["format"]
    if how is None or mode == "annotation":
        return
    if not how.llguidance:
        del sub["format"]
    added: dict[str, Any] = {}
    if how.pattern is not None:
        added["pattern"] = how.pattern
    if how.max_length is not None:
        added["maxLength"] = how.max_length
    if not added:
        return
    # One pattern per subschema: a second one goes into the allOf (llguidance intersects
    # the members' patterns); maxLength likewise keeps a smaller one of the schema's own.
    if "pattern" in added and "pattern" in sub:
        _conjoin(sub, {"pattern": added.pop("pattern")})
    if "maxLength" in added and "maxLength" in sub:
        _conjoin(sub, {"maxLength": added.pop("maxLength")})
    sub.update(added)


def _no_ops(sub: dict[str, Any]) -> None:
    for key in ("minProperties", "minItems", "minLength"):
        if sub.get(key) == 0 and not isinstance(sub[key], bool):
            del sub[key]
    if sub.get("uniqueItems") is False:
        del sub["uniqueItems"]
    max_items = sub.get("maxItems")
    if sub.get("uniqueItems") is True and isinstance(max_items, int) and max_items <= 1:
        del sub["uniqueItems"]  # zero or one item is always unique
    if sub.get("dependencies") == {}:
        del sub["dependencies"]


def _conjoin(sub: dict[str, Any], *members: Any) -> bool:
    """Add `members` to `sub`'s allOf (the conjunction); False when `sub` has an allOf that
    is not a list."""
    current = sub.get("allOf", [])
    if not isinstance(current, list):
        return False
    sub["allOf"] = [*current, *members]
    return True


def _negation(sub: dict[str, Any]) -> None:
    if "not" not in sub:
        return
    negated = negate(sub["not"])
    if negated is None:
        return
    if negated is True or _conjoin(sub, negated):
        del sub["not"]


def negate(inner: Any) -> Any:
    """A schema valid exactly where `inner` is not, for the forms handled, else None."""
    if isinstance(inner, bool):
        return not inner
    if not isinstance(inner, dict):
        return None
    keys = set(inner) - _ANNOTATIONS
    if not keys:
        return False
    if keys == {"required"} or (keys == {"required", "type"}
                                and inner["type"] in ("object", ["object"])):
        names = inner["required"]
        if not _names(names):
            return None
        if not names:  # every object has all of no properties
            return {"type": [t for t in _TYPES if t != "object"]} if "type" in keys else False
        absent = _lacks_one(names)
        return absent if "type" in keys else {"type": "object", **absent}
    if keys == {"anyOf"} and isinstance(inner["anyOf"], list):
        return _negate_any_required(inner["anyOf"])
    if keys == {"type"}:
        return _other_types(inner["type"])
    return None


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


def _lacks_one(names: list[str]) -> dict[str, Any]:
    """Objects lacking at least one of `names` (anything that is not an object too)."""
    if len(set(names)) == 1:
        return {"properties": {names[0]: False}}
    return {"anyOf": [{"properties": {name: False}} for name in dict.fromkeys(names)]}


def _negate_any_required(members: list[Any]) -> Any:
    """not anyOf[{required: A}, {required: B}...] = an object lacking one of A, one of B..."""
    parts = []
    for member in members:
        if not isinstance(member, dict) or set(member) - _ANNOTATIONS != {"required"}:
            return None
        if not _names(member["required"]):
            return None
        if not member["required"]:
            return False
        parts.append(_lacks_one(member["required"]))
    if not parts:
        return True  # an empty anyOf is invalid everywhere (not that llguidance takes one)
    return {"type": "object", "allOf": parts}


def _other_types(value: Any) -> Any:
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        return None
    if "integer" in listed and "number" not in listed:
        return None  # "a number that is not an integer" has no type of its own
    others = [t for t in _TYPES if t not in listed]
    return {"type": others} if others else False


def _dependencies(sub: dict[str, Any]) -> None:
    """`dependencies: {k: [a, b]}` = k absent, or k, a and b present; `{k: S}` = k absent, or
    present and S valid (on objects only: both forms say nothing about other values)."""
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        deps = sub.get(key)
        if not isinstance(deps, dict) or len(deps) > _MAX_DEPENDENCIES:
            continue
        members: list[Any] = []
        for name, dep in deps.items():
            absent = {"properties": {name: False}}
            if _names(dep):
                if dep:
                    members.append({"anyOf": [absent, {"required": [name, *dep]}]})
            elif dep is False:
                members.append(absent)
            elif isinstance(dep, dict) and set(dep) - _ANNOTATIONS:
                members.append({"anyOf": [absent, {"allOf": [{"required": [name]}, dep]}]})
            elif dep is not True and not isinstance(dep, dict):
                break  # not a dependency llguidance or the standard knows: leave it
        else:
            if _conjoin(sub, *members):
                del sub[key]


def _one_of(sub: dict[str, Any], root: dict[str, Any], inline: bool) -> None:
    branches = sub.get("oneOf")
    if not isinstance(branches, list) or not branches:
        return
    if len(branches) == 1:
        if _conjoin(sub, branches[0]):
            del sub["oneOf"]
        return
    if inline:
        sub["oneOf"] = [_inlined(branch, root) for branch in branches]


def _inlined(branch: Any, root: dict[str, Any]) -> Any:
    """`branch` with its top-level local `$ref` replaced by a copy of what it points at
    (siblings kept beside it, as 2019-09 and later read them), or `branch` unchanged."""
    for _ in range(_INLINE_DEPTH):
        if not isinstance(branch, dict) or not isinstance(branch.get("$ref"), str):
            return branch
        target = resolve(root, branch["$ref"])
        if not isinstance(target, dict | bool) or target is branch:
            return branch
        siblings = {k: v for k, v in branch.items() if k != "$ref"}
        if not set(siblings) - _ANNOTATIONS:
            branch = copy.deepcopy(target)
        elif isinstance(siblings.get("allOf", []), list):
            branch = {**siblings, "allOf": [*siblings.get("allOf", []), copy.deepcopy(target)]}
        else:
            return branch
    return branch
