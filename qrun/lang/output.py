"""Part of stage 3 (compile_template): the proof that a typed template's result fits its
`output:` schema (docs/language.md §4.2). Each property is a capture; each hole that binds it
gives values of a schema known from its constraint (INT: integers, options=[..]: those
strings, json=S: S); that schema must be contained in the property's. The containment check is
conservative: what it cannot prove is reported, at the hole, with the reason."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence, Set
from typing import Any
from urllib.parse import unquote

from qrun.constraint.grammar.schema import close_objects
from qrun.constraint.spec import PATTERN_TYPES
from qrun.errors import TemplateCompileError, TemplateError
from qrun.lang import ir
from qrun.lang.args import MISSING, literal
from qrun.lang.declared import first_problem
from qrun.lang.expr import Name
from qrun.source import Source, Span

_VALUE_TYPES = {"int": "integer", "float": "number", "bool": "boolean"}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$schema",
                          "deprecated", "readOnly", "writeOnly"})
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_FULL_MATCH = ("^(?:", ")$")
"""How a regex= hole's pattern (it must match the whole value) is written as a JSON Schema
`pattern` (which is searched for in the value): anchored, so the two agree."""
_REFS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
_DEFINITIONS = frozenset({"$defs", "definitions"})
MAX_REF_HOPS = 32
"""$refs followed in a row (a $ref to a $ref ...) before the proof gives up: a loop of them
("$ref": "#") is a schema no value is checked against, never a proof."""
_TOOL_CALL = {"type": "object", "properties": {"name": {"type": "string"},
                                               "arguments": {"type": "object"}},
              "required": ["name", "arguments"]}


def check_output(schema: Mapping[str, Any], ops: Sequence[ir.Op], captures: Sequence[str],
                 source: Source, span: Span | None, bound: Set[str]) -> list[TemplateError]:
    """The errors for the properties of `schema` that are not captures, whose holes cannot
    be proven to give values that fit, or that are required but captured only on some paths
    (`bound`: the captures every path binds; a loop's list always exists)."""
    errors: list[TemplateError] = []
    where = span or source.span_at(0)
    constants = constant_sets(ops)
    holes: dict[str, list[tuple[ir.Gen | ir.Select, Source]]] = {}
    for op, inner in ir.holes(ops, source):
        holes.setdefault(op.name, []).append((op, inner))
    for name, wanted in schema.get("properties", {}).items():
        if name not in holes:
            errors.append(TemplateCompileError(
                f"output property '{name}' is not a capture of the template", where, source,
                [f"captures: {', '.join(captures) or 'none'}; the output record's properties "
                 "are the values of holes"]))
            continue
        first, first_source = holes[name][0]
        if name in schema.get("required", ()) and name not in bound and not first.in_loop:
            errors.append(TemplateCompileError(
                f"output '{name}' is required, but a run may end without capturing it",
                first.span, first_source,
                ["its hole is not on every path of the template (inside an if, after a break)",
                 f"make it optional: `{name}: TYPE?` (docs/language.md §4.2)"]))
        for op, inner in holes[name]:
            given, how = produced_schema(op, constants)
            reason = "its constraint is computed at run time" if given is None \
                else contained(given, wanted)
            if reason is not None:
                errors.append(TemplateCompileError(
                    f"output '{name}' is not proven to be {_show(wanted)}: {reason}", op.span,
                    inner, [f"the hole gives {how}",
                            "constrain the hole so that it can only give such a value "
                            "(docs/language.md §4.2)"]))
    return errors


def produced_schema(op: ir.Gen | ir.Select, constants: Mapping[str, Any] | None = None
                    ) -> tuple[dict[str, Any] | None, str]:
    """The JSON Schema of the values the hole can give (a list of them in a loop), and how it
    gives them in words; None when its constraint is known only at run time. `constants`:
    names whose value is known before the run (constant_sets)."""
    schema, how = _one_value(op, constants or {})
    if schema is not None and op.in_loop:
        return {"type": "array", "items": schema}, f"a list (the hole is in a loop) of {how}"
    return schema, how


def constant_sets(ops: Sequence[ir.Op]) -> dict[str, Any]:
    """The names the template `set`s once, at its top level, to a literal (`{% set schema =
    {...} %}` before a `json=schema` hole): read anywhere after, they hold that literal.
    A name set anywhere else too (a branch, a loop, an included file) is left out."""
    counts: dict[str, int] = {}
    for op in ir.walk(ops):
        if isinstance(op, ir.Set):
            counts[op.name] = counts.get(op.name, 0) + 1
    found: dict[str, Any] = {}
    for op in ops:
        if isinstance(op, ir.Set) and counts[op.name] == 1:
            value = literal(op.expr)
            if value is not MISSING:
                found[op.name] = value
    return found


def _argument(expr: Any, constants: Mapping[str, Any]) -> Any:
    """A hole argument's value when it is known before the run: a literal, or a name of
    `constants`; else MISSING."""
    if isinstance(expr, Name) and expr.name in constants:
        return constants[expr.name]
    return literal(expr)


def _one_value(op: ir.Gen | ir.Select, constants: Mapping[str, Any]
               ) -> tuple[dict[str, Any] | None, str]:
    if isinstance(op, ir.Select):
        options = _argument(op.options, constants)
        if options is MISSING or not isinstance(options, list):
            # The run takes only a list of strings (docs/language.md §8): some string.
            return {"type": "string"}, "one of options computed at run time (text)"
        return {"type": "string", "enum": options}, f"one of {json.dumps(options)}"
    constraint = op.params.constraint
    match constraint:
        case None:
            return {"type": "string"}, "any text (it has no constraint)"
        case ir.Regex(stdlib_name=name) if name is not None:
            kind = _VALUE_TYPES.get(PATTERN_TYPES.get(name, ""), "string")
            given: dict[str, Any] = {"type": kind}
            if kind == "string" and constraint.lowered is not None:
                given["pattern"] = _anchored(constraint.lowered.pattern)
            return given, f"{'text' if kind == 'string' else kind} values (regex={name})"
        case ir.Regex(pattern=pattern):
            value = _argument(pattern, constants)
            if not isinstance(value, str):
                return {"type": "string"}, "text matching a regex computed at run time"
            return {"type": "string", "pattern": _anchored(value)}, \
                f"text matching regex={json.dumps(value)}"
        case ir.JsonSchema(schema=expr):
            value = _argument(expr, constants)
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    return None, "JSON"
            if not isinstance(value, dict | bool):
                return None, "JSON of a schema computed at run time"
            # The hole's closed= option as written (lang/args.py); one computed at run time
            # may be false, and an open schema allows more, so reading it as open is safe.
            closed = constraint.closed is not None and literal(constraint.closed) is True
            shown = json.dumps(value)
            return (close_objects(value) if closed and isinstance(value, dict) else
                    value if isinstance(value, dict) else {} if value else {"not": {}}), \
                f"JSON valid under {shown[:80]}{'…' if len(shown) > 80 else ''}"
        case ir.Grammar():
            return {"type": "string"}, "text of a Lark grammar"
        case ir.ToolCall():
            return dict(_TOOL_CALL), "a tool call {name, arguments}"
    return None, "values of an unknown kind"


def _anchored(pattern: str) -> str:
    return _FULL_MATCH[0] + pattern + _FULL_MATCH[1]


def _uses_refs(schema: Any) -> bool:
    if isinstance(schema, dict):
        return any(key in _REFS or _uses_refs(value) for key, value in schema.items())
    if isinstance(schema, list):
        return any(_uses_refs(item) for item in schema)
    return False


def contained(given: Any, wanted: Any, root: Any = None) -> str | None:
    """Why a value valid under `given` may not be valid under `wanted`, or None when every
    one is (a sufficient check: it only says None where it has proven it). `root`: the
    document `given` is part of (itself when None), which its local `$ref`s point into."""
    # The output's types are refused with a $ref (lang/declared.py): a $ref here would be
    # read against the result record, not against the schema it was written in. Checked
    # once: the proof below only meets parts of `wanted`.
    if _uses_refs(wanted):
        return "the output's schema uses $ref, which the proof does not follow"
    return _contained(given, wanted, _Document(given if root is None else root))


class _Document:
    """The document a hole's schema is part of, where its local `$ref`s point, and whether
    it has an `$id` below its root (walked once, on the first `$ref`, not at each)."""

    def __init__(self, root: Any) -> None:
        self.root = root

    @functools.cached_property
    def inner_ids(self) -> bool:
        return _has_inner_ids(self.root)


def _contained(given: Any, wanted: Any, doc: _Document) -> str | None:
    """contained() of `wanted` with no `$ref` anywhere in it, in the document `doc`."""
    given, unfollowed = _resolved(given, doc)
    if unfollowed is not None:
        return unfollowed
    if not isinstance(given, dict | bool) or not isinstance(wanted, dict | bool):
        return "a schema here is neither a mapping nor true/false"
    if wanted is True or wanted == {} or _same(given, wanted):
        return None
    if wanted is False:
        return "the output allows no value"
    if given is False:
        return None
    if given is True:
        given = {}
    finite = _finite(given)
    if finite is not None:
        for value in finite:
            problem = first_problem(wanted, value)
            if problem is not None:
                return f"it may give {json.dumps(value)}, which does not fit: {problem[1]}"
        return None
    if set(given) - _ANNOTATIONS - _DEFINITIONS == {"anyOf"}:
        for branch in given["anyOf"]:
            reason = _contained(branch, wanted, doc)
            if reason is not None:
                return reason
        return None
    for key, value in wanted.items():
        reason = _keyword(given, key, value, wanted, doc)
        if reason is not None:
            return reason
    return None


def _resolved(schema: Any, doc: _Document) -> tuple[Any, str | None]:
    """`schema` with its `$ref` followed (to the subschema of `doc` it points at, then that
    one's, MAX_REF_HOPS at most), or why it cannot be: a $ref beside keywords that constrain
    (draft 2019-09 on applies both), to another document, to an anchor, or to nothing; a
    document with an `$id` inside (a fragment then resolves against that resource)."""
    for _ in range(MAX_REF_HOPS):
        if not isinstance(schema, dict) or not set(schema) & _REFS:
            return schema, None
        dynamic = sorted(set(schema) & (_REFS - {"$ref"}))
        if dynamic:
            return schema, f"it uses {dynamic[0]}, which the proof does not follow"
        ref = schema["$ref"]
        besides = sorted(set(schema) - {"$ref"} - _DEFINITIONS - _ANNOTATIONS)
        if besides:
            return schema, (f"it uses $ref beside {', '.join(besides)}, which the proof does "
                            "not follow (move them into the schema it points at)")
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            return schema, (f"its $ref {json.dumps(ref)} points outside the schema, which "
                            "the proof does not follow")
        if doc.inner_ids:
            return schema, "it uses $ref in a schema with an inner $id, which the proof " \
                "does not follow"
        target = _pointed(doc.root, ref)
        if target is MISSING:
            return schema, f"its $ref {json.dumps(ref)} points at nothing"
        schema = target
    return schema, f"its $ref chain is longer than {MAX_REF_HOPS} (or a loop)"


def _pointed(root: Any, ref: str) -> Any:
    """The part of `root` that the JSON pointer fragment `ref` ("#/a/b") names, or MISSING."""
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return MISSING
    return node


def _has_inner_ids(schema: Any, top: bool = True) -> bool:
    if isinstance(schema, dict):
        return (not top and "$id" in schema) or any(
            _has_inner_ids(value, False) for value in schema.values())
    if isinstance(schema, list):
        return any(_has_inner_ids(item, False) for item in schema)
    return False


def _finite(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return None


def _keyword(given: dict[str, Any], key: str, value: Any, wanted: dict[str, Any],
             doc: _Document) -> str | None:
    if key in _ANNOTATIONS:
        return None
    if key == "type":
        return _type_reason(given, value)
    if key == "properties":
        return _properties_reason(given, value, doc)
    if key == "required":
        missing = [name for name in value if name not in given.get("required", ())]
        return f"it may leave out {', '.join(missing)}" if missing else None
    if key == "additionalProperties":
        return _additional_reason(given, value, wanted, doc)
    if key == "items":
        return _items_reason(given, value, wanted, doc)
    if key == "pattern" and isinstance(value, str) and _pattern_holds(given.get("pattern"), value):
        return None
    if key == "anyOf":
        if any(_contained(given, branch, doc) is None for branch in value):
            return None
        return "it fits none of the anyOf branches"
    if key == "allOf":
        reasons = [_contained(given, branch, doc) for branch in value]
        return next((r for r in reasons if r is not None), None)
    if key in _LOWER_BOUNDS or key in _UPPER_BOUNDS:
        bound = given.get(key)
        lower = key in _LOWER_BOUNDS
        # draft-04's exclusiveMaximum: true is a flag, not a bound (bool is an int in Python)
        if _number(bound) and _number(value) and (bound >= value if lower else bound <= value):
            return None
        return f"it does not guarantee {key} {json.dumps(value)}"
    if key in given and _same(given[key], value):
        return None
    return f"it does not guarantee {key}: {json.dumps(value)}"


def _same(one: Any, other: Any) -> bool:
    """Equal as JSON: Python's 1 == True and 1 == 1.0 are not JSON Schema's."""
    return json.dumps(one, sort_keys=True) == json.dumps(other, sort_keys=True)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pattern_holds(given: Any, wanted: str) -> bool:
    """Whether every string the `given` pattern (searched for, JSON Schema's reading) accepts
    contains a match of `wanted`. The same pattern does; so does a regex= hole's pattern P
    (anchored by _anchored) for `P`, `^P$` and `^(?:P)$`, since a match of the whole value
    satisfies both anchors. A json= hole's pattern is a search: `a` does not give `^a$`."""
    if not isinstance(given, str):
        return False
    if given == wanted:
        return True
    start, end = _FULL_MATCH
    if not (given.startswith(start) and given.endswith(end)):
        return False
    inner = given[len(start):-len(end)]
    return wanted in (inner, f"^{inner}$", _anchored(inner))


def _items_reason(given: dict[str, Any], value: Any, wanted: dict[str, Any],
                  doc: _Document) -> str | None:
    # prefixItems and the array forms of items give the first items schemas of their own,
    # which `items` alone does not say (draft 2020-12 and draft 2019-09 readings differ).
    for key in ("prefixItems", "additionalItems"):
        if key in given or key in wanted:
            return f"it uses {key}, which the proof does not follow"
    items = given.get("items", {})
    if not isinstance(items, dict | bool) or not isinstance(value, dict | bool):
        return "items as a list of schemas is not proven (use prefixItems-free items)"
    reason = _contained(items, value, doc)
    return None if reason is None else f"an item: {reason}"


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _type_reason(given: dict[str, Any], value: Any) -> str | None:
    wanted = {value} if isinstance(value, str) else set(value)
    if "number" in wanted:
        wanted.add("integer")
    have = _types(given)
    if have is None:
        return f"it may give any JSON value, not only {' or '.join(sorted(wanted))}"
    extra = have - wanted
    if extra:
        return f"it gives {' or '.join(sorted(have))} values, not {' or '.join(sorted(wanted))}"
    return None


def _patterns_reason(given: dict[str, Any], wanted: Any, what: str, doc: _Document) -> str | None:
    """Why a property matching one of the hole's patternProperties may not fit `wanted`."""
    for pattern, schema in given.get("patternProperties", {}).items():
        reason = _contained(schema, wanted, doc)
        if reason is not None:
            return f"{what} matching patternProperties {json.dumps(pattern)}: {reason}"
    return None


def _properties_reason(given: dict[str, Any], wanted: dict[str, Any], doc: _Document) -> str | None:
    have = given.get("properties", {})
    for name, schema in wanted.items():
        if name not in have:
            reason = _patterns_reason(given, schema, f"property '{name}'", doc)
            if reason is not None:
                return reason
        if name in have:
            inner = have[name]
        elif given.get("additionalProperties") is False:
            continue  # never present
        else:
            inner = given.get("additionalProperties", {})
        reason = _contained(inner, schema, doc)
        if reason is not None:
            return f"property '{name}': {reason}"
    return None


def _additional_reason(given: dict[str, Any], value: Any, wanted: dict[str, Any],
                       doc: _Document) -> str | None:
    listed = set(wanted.get("properties", {}))
    for name, schema in given.get("properties", {}).items():
        if name not in listed:
            reason = _contained(schema, value, doc)
            if reason is not None:
                return f"property '{name}' is not one the output lists"
    reason = _patterns_reason(given, value, "a property", doc)
    if reason is not None:
        return reason
    extra = given.get("additionalProperties", True)
    if extra is False:
        return None
    reason = _contained(extra if isinstance(extra, dict) else {}, value, doc)
    return None if reason is None else \
        "it may give properties the output does not list (give the hole closed=true)"


def _show(schema: Any) -> str:
    text = json.dumps(schema)
    if isinstance(schema, dict) and set(schema) - _ANNOTATIONS == {"type"}:
        text = str(schema["type"])
    return text if len(text) <= 60 else text[:57] + "..."
