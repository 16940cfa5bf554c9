"""The sound rewrite of a JSON Schema before llguidance compiles it (grammar.py): forms
llguidance 1.7 refuses are turned into equivalent ones it takes. Each rewrite keeps the set
of valid instances exactly, or (where said) makes it smaller, so no invalid instance gets
through (tests/constraint/grammar/test_rewrite.py checks each against the `jsonschema`
validator):

- A subschema whose values come from a finite list (`enum`, `const`, an `allOf` member or
  `$ref` target that is one) becomes the enum of those its other keywords accept
  (finite.py, with the `jsonschema` validator): `allOf: [{enum}, {not ...}]` and the like.
- `format` is asserted whatever the schema's draft (formats.py says how: llguidance's own
  format, a `pattern` qrun writes where llguidance's is looser than the `jsonschema` checker
  (dates and times: year 0000, February 29 of common years, leap seconds), or both
  (hostnames over 253 characters). A written pattern beside the subschema's own `pattern`
  goes into an `allOf` (both hold). With `formats="annotation"` every format is dropped
  (JSON Schema Validation 2020-12 section 7.2 makes `format` an annotation by default), with
  `formats="known"` the unknown ones are; with the default "assert" an unknown one stays for
  llguidance to refuse (grammar/text.py check_schema names it and its pointer first).
- `not` of the forms negation.py has a complement for (`required`, `type`, `enum`/`const`,
  bounds, `properties`, `not`, `anyOf`/`allOf`, `$ref`...).
- `if`/`then`/`else` (draft-07 on) becomes `anyOf: [{allOf: [if, then]}, {allOf: [not if,
  else]}]` where `if` has a complement.
- `dependencies`, `dependentRequired` and `dependentSchemas` become `anyOf` pairs ("absent,
  or present with its dependencies").
- `oneOf` branches that are local `$ref`s are inlined (llguidance proves branches disjoint
  only when it sees their content); a one-branch `oneOf` is that branch; a `oneOf` whose
  branches can be made disjoint (one_of.py) becomes an `anyOf` of them.
- `contains` becomes an `anyOf` of the first positions the first match may take
  (contains.py; fewer values: a first match past them is refused).
- `multipleOf` with a few negative multiples in range: llguidance writes none, the rewrite
  lists them in an enum beside it (multiples.py).
- `minProperties`/`maxProperties` beside optional properties become an `anyOf` of which
  listed ones are present (counts.py; on an open object, `minProperties` fewer values).
- Keywords beside a `$ref` that say nothing there (refs.py): all of them in drafts 4-7,
  which ignore them; annotations, and a `type` the target (or each `anyOf` branch) implies,
  in any draft. llguidance refuses them beside a circular `$ref`.
- `propertyNames` that is a finite list of names, one `pattern` or length bounds becomes
  listed properties or a `patternProperties` key (property_names.py).
- No-op keywords llguidance refuses anyway (`uniqueItems: false`, `minProperties: 0`...).
- A string subschema with a `pattern` or `format` that appears in several places moves to
  one `$defs` entry, a `$ref` at each place (shared_strings.py: llguidance builds a pattern
  once per place).
- Patterns llguidance 1.7 would quote wrongly (letting `"` or `\\` through a class that
  excludes it) leave U+0000 out of the classes concerned, last, over every subschema
  (pattern_escapes.py; fewer values; text.py refuses the one case it cannot fix).

A `not`, `oneOf` or `if` that a `$ref` points into stays as written (the `$ref` would dangle).
Not rewritten (and so refused by llguidance with its reason): `uniqueItems: true` (but over
a short finite list), an `if` without a complement, `contains` beside a tuple form or
`maxContains`, the `propertyNames`
property_names.py has no form for, `not` of anything else, a `oneOf` whose overlap has no
form, other siblings of a circular `$ref` in 2019-09 and later.
"""

from __future__ import annotations

from typing import Any

from qrun.constraint.grammar.contains import contains_positions
from qrun.constraint.grammar.counts import count_properties
from qrun.constraint.grammar.finite import FILTERED, document_validator, filter_finite
from qrun.constraint.grammar.formats import assertion
from qrun.constraint.grammar.multiples import negative_multiples
from qrun.constraint.grammar.negation import negate
from qrun.constraint.grammar.one_of import disjoint_one_of
from qrun.constraint.grammar.pattern_escapes import fix_patterns
from qrun.constraint.grammar.property_names import property_names
from qrun.constraint.grammar.refs import drop_ref_siblings
from qrun.constraint.grammar.schema import (
    PROSE,
    copy_json,
    draft_of,
    pinned_keys,
    ref_targets,
    resolve,
    subschemas,
)
from qrun.constraint.grammar.shared_strings import share_strings

__all__ = ["rewrite"]
# Keywords that never change which instances are valid.
_ANNOTATIONS = frozenset({"$schema", "$id", "id", "$comment", "title", "description",
                          "default", "examples", "example", "readOnly", "writeOnly",
                          "deprecated", "$anchor"})
# A document with `$id`s below its root changes the base of `$ref`s inside them: its refs
# are not inlined (they would resolve against the wrong base).
_IDS = ("$id", "id")
# The keywords of _no_ops and of _dependencies.
_NO_OPS = frozenset({"minProperties", "minItems", "minLength", "uniqueItems", "dependencies"})
_DEPENDENCIES = frozenset({"dependencies", "dependentRequired", "dependentSchemas"})
# A pattern to fix comes from the schema, or from the rewrites that write patterns: formats
# (formats.py, which _formats reports), complements (negation.py: `not`, `if`, and a
# `oneOf`'s complements, which disjoint_one_of reports) and property_names.py.
_PATTERN_WRITERS = frozenset({"pattern", "patternProperties", "not", "if", "propertyNames"})
# A shared string (shared_strings.py) has one of these, as written or from formats.py.
_PATTERNS = frozenset({"pattern", "format"})
# Inlining follows a chain of `$ref`s at most this far.
_INLINE_DEPTH = 3
# dependencies become one `anyOf` pair each inside one allOf; llguidance multiplies the pairs
# out, so more than this many stay as written (and are refused).
_MAX_DEPENDENCIES = 6


def rewrite(schema: Any, formats: str = "assert") -> Any:
    """A copy of `schema` that llguidance compiles more often and that accepts the same
    instances (or fewer where the module docstring says so); non-objects come back as they
    are. `formats` is a formats.MODES value: how `format` keywords are read.

    A rewrite whose keywords appear in no subschema is skipped: most schemas need few of
    them, and the walks that found nothing were most of a large schema's rewrite time (a
    Kubernetes schema of MaskBench: 9 ms; issue #24 item 4)."""
    if not isinstance(schema, dict):
        return schema
    out = copy_json(schema)
    draft = draft_of(out)
    positions = subschemas(out)
    present: set[str] = set().union(*positions)
    inline = not any(key in sub for sub in positions[1:] for key in _IDS
                     if isinstance(sub.get(key), str)) if present & set(_IDS) else True
    root = out if inline else None  # where local `$ref`s may be followed
    # Per subschema, its keys below which a `$ref` points (rewrites leave them in place).
    kept = pinned_keys(out, ref_targets(out, positions)) if "$ref" in present else {}
    changed = "$ref" in present and drop_ref_siblings(out, draft, root, kept, positions)
    if inline and present & FILTERED and filter_finite(out, schema, draft, positions):
        changed = True
    if changed:  # subschemas (and the `$ref`s in them) were taken out
        positions = subschemas(out)
        kept = pinned_keys(out, ref_targets(out, positions)) if "$ref" in present else {}
    # Subschemas whose `not` or `oneOf` a `$ref` points into keep them as written; those
    # whose names a `$ref` points into keep them (property_names.py moves them), and those
    # whose items it points into keep `contains` (contains.py moves them).
    pinned = _pinned(kept, ("not", "oneOf", "if", "then", "else"))
    names_pinned = _pinned(kept, ("propertyNames", "additionalProperties",
                                  "patternProperties"))
    items_pinned = _pinned(kept, ("contains", "items"))
    has = present.__contains__
    no_ops = bool(present & _NO_OPS)
    counts = has("minProperties") or has("maxProperties")
    dependencies = bool(present & _DEPENDENCIES)
    wrote_patterns = False  # formats.py patterns: a `format` alone (int32...) writes none
    for sub in positions:
        if has("format"):
            wrote_patterns |= _formats(sub, draft, formats)
        if no_ops:
            _no_ops(sub)
        if counts:
            _property_counts(sub)
        if id(sub) not in pinned:
            if has("not"):
                _negation(sub, root)
            if draft >= 7 and has("if"):  # `if` is an unknown keyword before draft-07
                _conditional(sub, root)
        if dependencies:
            _dependencies(sub)
        if has("propertyNames") and id(sub) not in names_pinned:
            property_names(sub, root, draft, formats)  # property_names.py
        if has("contains") and id(sub) not in items_pinned:
            _contains(sub, draft)
        if inline and "multipleOf" in sub:
            _multiples(sub, schema, draft)
    complemented = False
    if "oneOf" in present:
        for sub in positions:
            _one_of(sub, out, inline)
            if id(sub) not in pinned:
                complemented |= disjoint_one_of(sub, root)  # one_of.py
    # Last, over every subschema the rewrites above made too (pattern_escapes.py), where
    # there is a pattern, or a rewrite ran that may have written one.
    if present & _PATTERN_WRITERS or wrote_patterns or complemented:
        for sub in subschemas(out):
            fix_patterns(sub)
    if present & PROSE:
        _drop_prose(positions, kept)
    # Last: the subschemas compared as JSON are final (prose dropped, formats written).
    if inline and present & _PATTERNS:
        share_strings(out, kept)  # shared_strings.py
    return out


def _drop_prose(positions: list[dict[str, Any]], kept: dict[int, set[str]]) -> None:
    """Take the prose out of the subschemas: keywords that never change which instances are
    valid and that llguidance reads past (a Kubernetes schema of MaskBench is two thirds
    descriptions: 137 of its grammar's KB). One a `$ref` points into stays."""
    for sub in positions:
        for key in PROSE & sub.keys():
            if key not in kept.get(id(sub), ()):
                del sub[key]


def _pinned(kept: dict[int, set[str]], keys: tuple[str, ...]) -> set[int]:
    """The ids of the subschemas below one of whose `keys` a `$ref` target lies (`kept`:
    schema.pinned_keys of the document)."""
    wanted = set(keys)
    return {node for node, pointed in kept.items() if pointed & wanted}


def _formats(sub: dict[str, Any], draft: int, mode: str) -> bool:
    """Assert `sub`'s format as formats.py says; drop it as an annotation (mode
    "annotation", or an unknown format in mode "known"). An unknown format in mode "assert"
    stays, for llguidance to refuse (check_schema names it first). Whether it wrote a
    pattern (for fix_patterns)."""
    if "format" not in sub:
        return False
    how = assertion(sub["format"], draft) if isinstance(sub["format"], str) else None
    if mode == "annotation" or (how is None and mode == "known"):
        del sub["format"]
    if how is None or mode == "annotation":
        return False
    if not how.llguidance:
        del sub["format"]
    added: dict[str, Any] = {}
    if how.pattern is not None:
        added["pattern"] = how.pattern
    if how.max_length is not None:
        added["maxLength"] = how.max_length
    if not added:
        return False
    # One pattern per subschema: a second one goes into the allOf (llguidance intersects
    # the members' patterns); maxLength likewise keeps a smaller one of the schema's own.
    if "pattern" in added and "pattern" in sub:
        _conjoin(sub, {"pattern": added.pop("pattern")})
    if "maxLength" in added and "maxLength" in sub:
        _conjoin(sub, {"maxLength": added.pop("maxLength")})
    sub.update(added)
    return how.pattern is not None


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


def _property_counts(sub: dict[str, Any]) -> None:
    members = count_properties(sub)
    if members is not None and _conjoin(sub, *members):
        sub.pop("minProperties", None)
        sub.pop("maxProperties", None)


def _conjoin(sub: dict[str, Any], *members: Any) -> bool:
    """Add `members` to `sub`'s allOf (the conjunction); False when `sub` has an allOf that
    is not a list."""
    current = sub.get("allOf", [])
    if not isinstance(current, list):
        return False
    sub["allOf"] = [*current, *members]
    return True


def _negation(sub: dict[str, Any], root: Any) -> None:
    if "not" not in sub:
        return
    negated = negate(sub["not"], root)
    if negated is None:
        return
    if negated is True or _conjoin(sub, negated):
        del sub["not"]


def _contains(sub: dict[str, Any], draft: int) -> None:
    if "contains" not in sub or not isinstance(sub.get("allOf", []), list):
        return
    positions = contains_positions(sub, draft)  # contains.py
    if positions:
        _conjoin(sub, positions)


def _multiples(sub: dict[str, Any], original: dict[str, Any], draft: int) -> None:
    if not isinstance(sub.get("allOf", []), list):
        return
    branches = negative_multiples(  # multiples.py
        sub, lambda part: document_validator(original, draft).evolve(schema=part))
    if branches is not None:
        _conjoin(sub, branches)


def _conditional(sub: dict[str, Any], root: Any) -> None:
    """if/then/else = (if and then) or (not if, and else); a missing branch is `true`."""
    if "if" not in sub:
        return
    condition = sub["if"]
    otherwise = negate(condition, root)
    if otherwise is None:
        return
    then, other = sub.get("then", True), sub.get("else", True)
    if _conjoin(sub, {"anyOf": [{"allOf": [condition, then]}, {"allOf": [otherwise, other]}]}):
        for key in ("if", "then", "else"):
            sub.pop(key, None)


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


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
            branch = copy_json(target)
        elif isinstance(siblings.get("allOf", []), list):
            branch = {**siblings, "allOf": [*siblings.get("allOf", []), copy_json(target)]}
        else:
            return branch
    return branch
