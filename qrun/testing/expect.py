"""What a test case's result must show (docs/testing.md §2), read from its `expect:` mapping:

- `vars: {NAME: VALUE}`: the capture's typed value equals VALUE (JSON equality: 1 == 1.0,
  key order ignored);
- `schema: {NAME: SCHEMA}`: the capture's value is valid under the JSON Schema;
- `that: EXPR` or a list of them: a qrun expression (docs/language.md §6, never Python
  eval) over the inputs and captures is true, such as `sentiment in ["positive", "mixed"]`;
- `text: REGEX` or a list of them: the regex is found in the result's text (the `regex`
  module, with a time limit: a pattern from a case file cannot hang the run).

Each check gives None or the failure's message; every expectation knows where it was written
in the case file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import regex

from qrun.constraint.grammar.schema import resolve, schema_positions
from qrun.errors import PositionedError, QrunError
from qrun.lang import expr as ex
from qrun.source import Source
from qrun.testing.where import CaseFileError, Where

__all__ = ["EXPECT_KEYS", "Expectation", "parse_expectations"]

EXPECT_KEYS = ("vars", "schema", "that", "text")
REGEX_TIMEOUT_S = 1.0
"""How long one `text:` regex (or a schema's pattern) may search: a catastrophic pattern fails
the case instead of hanging the run."""
MAX_PATTERN_CHARS = 1000
MAX_REPEAT_PRODUCT = 100_000
"""Bounds on a `text:` regex before it is compiled: its length, and the product of its counted
repeats' counts (an upper bound on how they nest)."""
_COUNTED = regex.compile(r"\{(?:\d*,)?(\d+)\}")
_SHOWN = 300


@dataclass(frozen=True)
class Expectation:
    """One thing a result must show: `kind` (one of EXPECT_KEYS), the capture it is about
    (vars and schema), the expected value, schema, expression or pattern, and where it was
    written."""

    kind: str
    subject: str | None
    expected: Any
    where: Where
    compiled: Any = None  # the parsed expression, or the compiled regex

    def describe(self) -> str:
        """The expectation as the case file says it."""
        if self.kind in ("vars", "schema"):
            return f"{self.kind}.{self.subject}: {_shown(self.expected)}"
        return f"{self.kind}: {self.expected}"

    def check(self, text: str, values: Mapping[str, Any]) -> str | None:
        """None when a result of `text` with captures and inputs `values` shows it, else
        what it shows instead."""
        if self.kind in ("vars", "schema") and self.subject not in values:
            return f"no capture or input named {self.subject!r} in the result"
        if self.kind == "vars":
            got = values[self.subject or ""]
            return None if _same(got, self.expected) else f"got {_shown(got)}"
        if self.kind == "schema":
            return _schema_failure(self.expected, values[self.subject or ""])
        if self.kind == "that":
            return _expression_failure(self.compiled, self.expected, values)
        try:
            found = self.compiled.search(text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            return f"the pattern took longer than {REGEX_TIMEOUT_S:g} s to search the text"
        return None if found else f"not found in the text {_shown(text)}"


def parse_expectations(value: Any, where_of: Callable[..., Where],
                       where: Where) -> list[Expectation]:
    """The expectations of an `expect:` value; `where_of(*path)` is the place of the value
    at `path` below it.

    Raises:
        CaseFileError: an unknown key, or a value of the wrong kind (an invalid
            schema, an expression that does not parse, a bad regex), with its place.
    """
    if not isinstance(value, dict) or not value:
        raise CaseFileError(f"expect is a mapping with one or more of {', '.join(EXPECT_KEYS)}",
                            where)
    found: list[Expectation] = []
    for key, given in value.items():
        if key not in EXPECT_KEYS:
            raise CaseFileError(f"unknown expectation {key!r} (expect takes "
                                f"{', '.join(EXPECT_KEYS)})", where_of(key))
        if key in ("vars", "schema"):
            if not isinstance(given, dict) or not given:
                raise CaseFileError(f"{key} maps capture names to "
                                    f"{'values' if key == 'vars' else 'JSON Schemas'}",
                                    where_of(key))
            for name, expected in given.items():
                place = where_of(key, name)
                if not isinstance(name, str):
                    raise CaseFileError(f"{key}: a capture name is text", place)
                if key == "schema":
                    _check_schema(expected, place)
                found.append(Expectation(key, name, expected, place))
            continue
        items = given if isinstance(given, list) else [given]
        if not items:
            raise CaseFileError(f"{key} is {'an expression' if key == 'that' else 'a regex'} "
                                "or a list of them", where_of(key))
        for index, item in enumerate(items):
            place = where_of(key, index) if isinstance(given, list) else where_of(key)
            if not isinstance(item, str) or not item.strip():
                raise CaseFileError(f"{key}: {'an expression' if key == 'that' else 'a regex'} "
                                    "is a non-empty string", place)
            compiled = _expression(item, place) if key == "that" else _pattern(item, place)
            found.append(Expectation(key, None, item, place, compiled))
    return found


def _check_schema(schema: Any, where: Where) -> None:
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    if not isinstance(schema, dict | bool):
        raise CaseFileError("a JSON Schema is a mapping (or true/false)", where)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise CaseFileError(f"not a valid JSON Schema: {exc.message}", where) from None
    for _, sub in schema_positions(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str) and (not ref.startswith("#") or resolve(schema, ref) is None):
            raise CaseFileError(f"$ref {ref!r} points nowhere in this schema (a case's schema "
                                "is one document: no other file or URL is read)", where)


def _expression(text: str, where: Where) -> ex.Expr:
    """The parsed qrun expression (as in `{{ ... }}`)."""
    from qrun.lang.build import build_ast
    from qrun.lang.parser import parse
    source = Source(str(where), "{{ " + text + " }}")
    try:
        body = build_ast(parse(source), source).body
    except PositionedError as exc:
        raise CaseFileError(f"that: {exc.message} at character {exc.span.column - 3} of "
                            f"{text!r}", where) from None
    if len(body) != 1 or not hasattr(body[0], "expr"):
        raise CaseFileError(f"that: {text!r} is not one expression", where)
    parsed: ex.Expr = body[0].expr
    for node in ex.walk(parsed):  # as the compiler refuses them in a template
        if isinstance(node, ex.Attr) and node.attr.startswith("_"):
            raise CaseFileError(f"that: attributes starting with '_' are not allowed: "
                                f"{node.attr!r}", where)
    return parsed


def _pattern(text: str, where: Where) -> Any:
    """The compiled `text:` regex, bounded first: compiling `((a{1000}){1000}){1000}` takes
    gigabytes, and the search's time limit does not cover it."""
    if len(text) > MAX_PATTERN_CHARS:
        raise CaseFileError(f"text: a regex of at most {MAX_PATTERN_CHARS:,} characters", where)
    counts = [int(n) for n in _COUNTED.findall(text)]
    if math.prod(max(1, n) for n in counts) > MAX_REPEAT_PRODUCT:
        raise CaseFileError(f"text: the counted repeats ({{n}}, {{m,n}}) of a regex multiply "
                            f"to at most {MAX_REPEAT_PRODUCT:,}", where)
    try:
        return regex.compile(text)
    except (regex.error, OverflowError, MemoryError, RecursionError) as exc:
        raise CaseFileError(f"text: not a valid regex: {exc}", where) from None


def _schema_failure(schema: Any, value: Any) -> str | None:
    errors = sorted(_validator(schema).iter_errors(value), key=lambda e: e.path)
    if not errors:
        return None
    first = errors[0]
    at = "".join(f"[{json.dumps(p)}]" for p in first.absolute_path)
    return f"{_shown(value)} is not valid: {first.message}" + (f" (at {at})" if at else "")


def _validator(schema: Any) -> Any:
    """The `jsonschema` validator of `schema`'s draft, its `pattern` and `patternProperties`
    searched with the `regex` module under REGEX_TIMEOUT_S (Python's `re`, which jsonschema
    uses, has no time limit: a case file's `^(a+)+$` could hang the run)."""
    from jsonschema import ValidationError
    from jsonschema.validators import extend, validator_for

    def search(pattern: str, text: str) -> bool | None:
        """Whether `pattern` is found in `text`; None when it takes too long."""
        try:
            return regex.search(pattern, text, timeout=REGEX_TIMEOUT_S) is not None
        except TimeoutError:
            return None

    def pattern(validator: Any, wanted: str, instance: Any, _: Any) -> Any:
        if validator.is_type(instance, "string"):
            found = search(wanted, instance)
            if found is None:
                yield ValidationError(f"the pattern {wanted!r} took longer than "
                                      f"{REGEX_TIMEOUT_S:g} s")
            elif not found:
                yield ValidationError(f"{instance!r} does not match {wanted!r}")

    def pattern_properties(validator: Any, patterns: Any, instance: Any, _: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        for wanted, subschema in patterns.items():
            for key, item in instance.items():
                found = search(wanted, key)
                if found is None:
                    yield ValidationError(f"the pattern {wanted!r} took longer than "
                                          f"{REGEX_TIMEOUT_S:g} s")
                elif found:
                    yield from validator.descend(item, subschema, path=key, schema_path=wanted)

    cls = extend(validator_for(schema), {"pattern": pattern,
                                         "patternProperties": pattern_properties})
    return cls(schema)


def _expression_failure(parsed: ex.Expr, text: str, values: Mapping[str, Any]) -> str | None:
    from qrun.lang.evaluate import evaluate

    try:
        outcome = evaluate(parsed, values, Source("<that>", "{{ " + text + " }}"))
    except QrunError as exc:
        message = exc.message if isinstance(exc, PositionedError) else str(exc)
        return f"the expression failed: {message}"
    if outcome is True:
        return None
    names = sorted({node.name for node in ex.walk(parsed) if isinstance(node, ex.Name)
                    and node.name in values})
    shown = ", ".join(f"{name} = {_shown(values[name])}" for name in names)
    return f"it is {_shown(outcome)}" + (f" where {shown}" if shown else "")


def _same(got: Any, expected: Any) -> bool:
    """JSON equality: numbers by value (but not booleans as numbers), mappings whatever their
    key order."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(got, int | float) and isinstance(expected, int | float):
        return got == expected
    if isinstance(got, Mapping) and isinstance(expected, Mapping):
        return set(got) == set(expected) and all(_same(got[k], expected[k]) for k in got)
    if isinstance(got, list | tuple) and isinstance(expected, list | tuple):
        return len(got) == len(expected) and all(map(_same, got, expected))
    return type(got) is type(expected) and bool(got == expected)


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"

