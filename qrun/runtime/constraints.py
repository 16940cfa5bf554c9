"""From a hole's constraint (IR) to a mask cursor: evaluates the pattern or schema, lowers
JSON Schema to a regex, and compiles token indexes once per backend (shared by every run)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qrun.backends.base import Backend
from qrun.errors import ConstraintError, EvaluationError
from qrun.lang import ir
from qrun.lang.evaluate import evaluate
from qrun.runtime.dfa import PatternError
from qrun.runtime.healing import HealCursor, PrefixMasks
from qrun.runtime.masks import IndexCache, MaskCursor
from qrun.source import Source, Span
from qrun.stdlib.json_schema import SchemaError, schema_to_regex


class ConstraintCompiler:
    """Token indexes for one backend's vocabulary, built lazily and cached."""

    def __init__(self, backend: Backend, max_indexes: int = 64) -> None:
        self.backend = backend
        self.indexes = IndexCache(max_indexes)
        self._prefix_masks: PrefixMasks | None = None

    def pattern(
        self, constraint: ir.Constraint, scope: Mapping[str, Any], source: Source, span: Span
    ) -> str:
        """The regex a constraint stands for.

        Raises:
            ConstraintError: a JSON Schema outside the supported subset.
            EvaluationError: the pattern or schema expression has the wrong type.
        """
        match constraint:
            case ir.Regex():
                value = evaluate(constraint.pattern, scope, source)
                if not isinstance(value, str):
                    raise EvaluationError(f"regex must be a string, got {type(value).__name__}",
                                          constraint.pattern.span, source)
                return value
            case ir.JsonSchema():
                schema = evaluate(constraint.schema, scope, source)
                if isinstance(schema, str):
                    schema = _parse_schema(schema, constraint, source)
                if not isinstance(schema, dict):
                    raise EvaluationError(
                        f"json must be a JSON Schema object, got {type(schema).__name__}",
                        constraint.schema.span, source)
                try:
                    return schema_to_regex(schema)
                except SchemaError as exc:
                    raise ConstraintError(str(exc), constraint.schema.span, source) from None

    def cursor(
        self,
        constraint: ir.Constraint,
        scope: Mapping[str, Any],
        source: Source,
        span: Span,
        prefix: bytes = b"",
    ) -> MaskCursor:
        """A fresh cursor at the start of the constraint, which first requires the healed
        `prefix` (text taken back from the context) when one is given.

        Raises:
            ConstraintError: the pattern cannot be compiled to a token mask.
        """
        pattern = self.pattern(constraint, scope, source, span)
        if prefix:
            pattern = literal_pattern(prefix.decode("utf-8")) + "(?:" + pattern + ")"
        try:
            index = self.indexes.get(pattern, self.backend.vocabulary)
        except PatternError as exc:
            where = constraint.pattern.span if isinstance(constraint, ir.Regex) else span
            raise ConstraintError(str(exc), where, source) from None
        return index.start()


    def heal_cursor(self, prefix: bytes) -> HealCursor:
        """The cursor of an unconstrained hole that must first produce `prefix`."""
        if self._prefix_masks is None:
            self._prefix_masks = PrefixMasks(self.backend.vocabulary)
        return HealCursor(self._prefix_masks, prefix)


def literal_pattern(text: str) -> str:
    """A regex matching exactly `text`: every non-alphanumeric character as a \\x/\\u escape,
    which the DFA front end reads unambiguously."""
    out = []
    for char in text:
        if char.isascii() and char.isalnum():
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return "".join(out)


def _parse_schema(text: str, constraint: ir.JsonSchema, source: Source) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"json schema string is not valid JSON: {exc}",
                              constraint.schema.span, source) from None
