"""JSON instances for differential tests of a JSON Schema matcher: valid ones drawn by
hypothesis-jsonschema and checked by the `jsonschema` validator (formats asserted), invalid
ones made by mutating valid ones and kept only when the validator rejects them without
asserting formats (so they are invalid by the standard, where `format` is an annotation).
Also: key orders, serialization, and random tokenizations of a text."""

from __future__ import annotations

import copy
import functools
import json
import random
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from qrun.constraint.grammar.schema import pointer_target
from qrun.constraint.vocab import Vocabulary

__all__ = [
    "RegexTimeout",
    "dumps",
    "invalid_instances",
    "random_tokenization",
    "schema_key_order",
    "valid_instances",
    "validators",
]

Validator = Callable[[Any], bool]


def validators(schema: Any) -> tuple[Validator, Validator]:
    """(is_valid with formats asserted, is_valid by the standard), for `schema`'s draft.
    Regexes (`pattern`, `patternProperties`) follow ECMA-262 as JSON Schema says, not
    Python's `re`: `\\d` is [0-9] only, as in llguidance. Both raise RegexTimeout when a
    pattern takes too long."""
    import jsonschema

    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = jsonschema.validators.extend(base, {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    })
    strict = cls(schema, format_checker=base.FORMAT_CHECKER)
    plain = cls(schema)
    return strict.is_valid, plain.is_valid


# ECMA-262 semantics for \\d, \\w, \\b (ASCII), with a time limit: a backtracking engine on a
# pattern like `^((?:.?[0-9]+){3,})$` (SchemaStore's tizen_workspace) never returns
# (regress, the Rust ECMA engine, cannot be interrupted; `regex` takes a timeout).
_REGEX_TIMEOUT_S = 0.5


class RegexTimeout(Exception):
    """A schema pattern took too long on an instance: the instance is skipped."""


@functools.lru_cache(maxsize=4096)
def _ecma(pattern: str) -> Any:
    import regex

    return regex.compile(pattern, regex.ASCII)


def _search(pattern: str, text: str) -> bool:
    try:
        return _ecma(pattern).search(text, timeout=_REGEX_TIMEOUT_S) is not None
    except TimeoutError:
        raise RegexTimeout(pattern) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) \
        -> Iterator[Any]:
    if validator.is_type(instance, "object"):
        for pattern, subschema in patterns.items():
            for key, value in instance.items():
                if _search(pattern, key):
                    yield from validator.descend(value, subschema, path=key)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) \
        -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    listed = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [k for k in instance
              if k not in listed and not any(_search(p, k) for p in patterns)]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        yield ValidationError(f"additional properties {extras!r} are not allowed")


class _LegacyMany:
    """hypothesis-jsonschema 0.23.1 drives hypothesis's internal `many` through
    `more()`/`reject()`; hypothesis 6.170 made it a context manager iterated with `for`.
    This adapter gives the old calls over the new object (used only for test data)."""

    def __init__(self, data: Any, min_size: int, max_size: float, average_size: float) -> None:
        from hypothesis.internal.conjecture.utils import many

        self._many = many(data, min_size=min_size, max_size=max_size,
                          average_size=average_size)
        self._many.__enter__()
        self._steps = iter(self._many)

    def more(self) -> bool:
        try:
            next(self._steps)
        except StopIteration:
            self._many.__exit__(None)
            return False
        return True

    def reject(self, why: str | None = None) -> None:
        self._many.reject(why)


def _patch_hypothesis_jsonschema() -> None:
    import importlib

    from hypothesis.internal.conjecture import utils

    # The module whose `cu` (hypothesis's conjecture utils) the adapter replaces: a
    # third-party incompatibility, patched for test data only.
    _from_schema = importlib.import_module("hypothesis_jsonschema._from_schema")

    if not hasattr(utils.many, "more") and getattr(_from_schema, "cu", None) is utils:
        setattr(_from_schema, "cu", SimpleNamespace(many=_LegacyMany))  # noqa: B010


def valid_instances(
    schema: Any, count: int, seed: int = 0, usable: Callable[[Any], bool] | None = None
) -> list[Any]:
    """Up to `count` distinct instances of `schema` (hypothesis-jsonschema, seeded by
    `seed`), each valid with formats asserted and `usable` (when given).

    Raises:
        Exception: whatever hypothesis-jsonschema raises for a schema it cannot handle
            (unsupported keyword or draft, unresolvable $ref, unsatisfiable).
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis_jsonschema import from_schema

    _patch_hypothesis_jsonschema()
    is_valid, _ = validators(schema)
    found: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # A copy: from_schema rewrites the schema it is given (refs resolved, properties
        # sorted), which would change the key order schema_key_order reads.
        strategy = from_schema(copy.deepcopy(schema))

        @hseed(seed)
        @settings(max_examples=count * 5, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(strategy)
        def collect(value: Any) -> None:
            if len(found) < count:
                text = json.dumps(value, sort_keys=True)
                try:
                    ok = text not in found and is_valid(value)
                except RegexTimeout:
                    return
                if ok and (usable is None or usable(value)):
                    found[text] = value

        collect()
    return list(found.values())


def invalid_instances(
    schema: Any, valid: list[Any], count: int, rng: random.Random
) -> list[Any]:
    """Up to `count` distinct mutants of the `valid` instances that the validator rejects by
    the standard (no format assertion). Mutants keep their parent's key order."""
    _, is_valid = validators(schema)
    found: dict[str, Any] = {}
    for _ in range(count * 8):
        if len(found) >= count or not valid:
            break
        mutant = _mutate(copy.deepcopy(rng.choice(valid)), rng)
        text = json.dumps(mutant)
        try:
            if text not in found and not is_valid(mutant):
                found[text] = mutant
        except RegexTimeout:
            continue
    return list(found.values())


_OTHER_VALUES: list[Any] = [None, True, 0, -7, 2.5, "", "qrun", [], {}, [1], {"q": 1}]


def _mutate(value: Any, rng: random.Random) -> Any:
    """One random change somewhere in `value`: a node replaced by another type or an edge
    value, a key dropped or added, an item appended or all removed."""
    nodes = _nodes(value)
    parent, key = rng.choice(nodes)
    node = value if parent is None else parent[key]
    choice = rng.randrange(6)
    if choice == 0 or not isinstance(node, dict | list):
        replacement = _edge_value(node, rng)
        if parent is None:
            return replacement
        parent[key] = replacement
    elif isinstance(node, dict):
        if node and choice in (1, 2):
            del node[rng.choice(list(node))]
        else:
            node[rng.choice(["qrun_extra", "$qrun", "", "x" * 40])] = rng.choice(_OTHER_VALUES)
    elif node and choice in (1, 2):
        node.append(copy.deepcopy(node[-1]))
    elif choice == 3:
        node.clear()
    else:
        node.append(rng.choice(_OTHER_VALUES))
    return value


def _edge_value(node: Any, rng: random.Random) -> Any:
    if isinstance(node, str) and rng.random() < 0.5:
        return rng.choice([node + "!", node * 40 + "x", "", node[:1], " " + node])
    if isinstance(node, bool) or node is None:
        return rng.choice([v for v in _OTHER_VALUES if v is not node])
    if isinstance(node, int | float) and rng.random() < 0.5:
        return rng.choice([node + 1, -node - 1, node * 1000003, node + 0.5, 10**12])
    return rng.choice([v for v in _OTHER_VALUES if type(v) is not type(node)])


def _nodes(value: Any) -> list[tuple[Any, Any]]:
    """(parent, key) of every node (the root is (None, None))."""
    out: list[tuple[Any, Any]] = [(None, None)]
    stack = [value]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) \
            if isinstance(node, list) else ()
        for key, child in items:
            out.append((node, key))
            stack.append(child)
    return out


def schema_key_order(value: Any, schema: Any, root: Any = None) -> Any:
    """`value` with object keys in the order llguidance generates them (JSON Schema says
    nothing about order; llguidance fixes it): keys of `properties` in schema order, merged
    through $ref, allOf, anyOf and oneOf as they appear, then `required`, then the rest.
    Only local refs are followed. A heuristic; see llg_corpus.search_order for the exact
    one."""
    root = schema if root is None else root
    if isinstance(value, list):
        items = _subschemas(schema, root, "items")
        return [schema_key_order(v, items[0] if items else {}, root) for v in value]
    if not isinstance(value, dict):
        return value
    order: list[str] = []
    for sub in _flatten(schema, root):
        order.extend(k for k in sub.get("properties", {}) if k not in order)
    for sub in _flatten(schema, root):
        order.extend(k for k in sub.get("required", []) if k not in order)
    keys = [k for k in order if k in value] + [k for k in value if k not in order]
    out = {}
    for key in keys:
        out[key] = schema_key_order(value[key], _property_schema(schema, root, key), root)
    return out


def _property_schema(schema: Any, root: Any, key: str) -> Any:
    """The subschema a property's value follows: from `properties`, else a matching
    `patternProperties` entry, else `additionalProperties` ({} when none is found)."""
    subs = _flatten(schema, root)
    for sub in subs:
        if isinstance(sub.get("properties"), dict) and key in sub["properties"]:
            return sub["properties"][key]
    for sub in subs:
        for pattern, value in (sub.get("patternProperties") or {}).items():
            if _search(pattern, key):
                return value
    for sub in subs:
        if isinstance(sub.get("additionalProperties"), dict):
            return sub["additionalProperties"]
    return {}


def _flatten(schema: Any, root: Any, depth: int = 0) -> list[dict[str, Any]]:
    """`schema` and the subschemas merged into it, in document order."""
    if not isinstance(schema, dict) or depth > 16:
        return []
    out = [schema]
    for key, sub in schema.items():
        if key == "$ref" and isinstance(sub, str) and sub.startswith("#"):
            out.extend(_flatten(_resolve(root, sub), root, depth + 1))
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(sub, list):
            for member in sub:
                out.extend(_flatten(member, root, depth + 1))
    return out


def _subschemas(schema: Any, root: Any, key: str) -> list[Any]:
    return [s[key] for s in _flatten(schema, root) if isinstance(s.get(key), dict)]


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local `$ref` ("#/...") names; {} where it leads nowhere."""
    node = pointer_target(root, ref[1:].split("/")[1:])
    return {} if node is None else node


def dumps(value: Any, item_separator: str = ", ", key_separator: str = ": ") -> str:
    """JSON text in qrun's layout (non-ASCII kept as UTF-8: llguidance 1.7 takes no \\u
    escape of a printable character)."""
    return json.dumps(value, ensure_ascii=False, separators=(item_separator, key_separator))


def random_tokenization(vocab: Vocabulary, data: bytes, rng: random.Random) -> list[int]:
    """Token ids whose bytes concatenate to `data`, each chosen at random among the tokens
    that are a prefix of what is left (tokens may split UTF-8 characters)."""
    out: list[int] = []
    pos = 0
    while pos < len(data):
        sizes = [n for n in range(1, min(vocab.max_token_len, len(data) - pos) + 1)
                 if vocab.is_token(data[pos:pos + n])]
        if not sizes:
            raise ValueError(f"no token starts with {data[pos:pos + 4]!r}")
        size = rng.choice(sizes)
        out.append(rng.choice(vocab.ids_of(data[pos:pos + size])))
        pos += size
    return out
