"""From a hole's constraint (IR) to a mask cursor: evaluates the pattern or schema for this run,
lowers JSON Schema to a regex, and compiles token indexes once per backend (shared by every
run)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from qrun.backends.base import Backend
from qrun.errors import ConstraintError, EvaluationError
from qrun.lang import ir
from qrun.lang.evaluate import evaluate
from qrun.limits import Budget
from qrun.runtime.healing import HealCursor, PrefixMasks
from qrun.runtime.hole import ConstraintSpec
from qrun.runtime.masks import IndexCache, MaskCursor
from qrun.source import Source
from qrun.stdlib.json_schema import SchemaError, schema_to_regex

# Named patterns whose values are read as Python values (docs/language.md §15.2).
PATTERN_TYPES = {"INT": "int", "FLOAT": "float", "BOOL": "bool"}


class ConstraintCompiler:
    """Token indexes for one backend's vocabulary, built lazily and cached."""

    def __init__(self, backend: Backend, max_indexes: int = 64) -> None:
        self.backend = backend
        self.indexes = IndexCache(max_indexes)
        self._prefix_masks: PrefixMasks | None = None

    def spec(
        self, constraint: ir.Constraint, scope: Mapping[str, Any], source: Source,
        budget: Budget | None = None,
    ) -> ConstraintSpec:
        """The regex a constraint stands for in this run.

        Raises:
            ConstraintError: a JSON Schema outside the supported subset.
            EvaluationError: the pattern or schema expression fails or has the wrong type.
        """
        match constraint:
            case ir.Regex(stdlib_name=str(name)):
                return ConstraintSpec(_evaluate_pattern(constraint, scope, source, budget),
                                      f"regex={name}", PATTERN_TYPES.get(name, "text"))
            case ir.Regex():
                pattern = _evaluate_pattern(constraint, scope, source, budget)
                return ConstraintSpec(pattern, f"regex={json.dumps(pattern)}")
            case ir.JsonSchema():
                schema = evaluate(constraint.schema, scope, source, budget)
                if isinstance(schema, str):
                    schema = _parse_schema(schema, constraint, source)
                if not isinstance(schema, dict):
                    raise EvaluationError(
                        f"json must be a JSON Schema object, got {type(schema).__name__}",
                        constraint.schema.span, source)
                try:
                    pattern = schema_to_regex(schema)
                except SchemaError as exc:
                    raise ConstraintError(str(exc), constraint.schema.span, source) from None
                return ConstraintSpec(pattern, "json=" + json.dumps(schema, sort_keys=True),
                                      "json")

    def cursor(self, spec: ConstraintSpec, prefix: bytes = b"") -> MaskCursor:
        """A fresh cursor at the start of the constraint, which first requires the healed
        `prefix` (text taken back from the context) when one is given.

        Raises:
            PatternError: the pattern cannot be compiled to a token mask.
        """
        return self.indexes.get(spec.pattern, self.backend.vocabulary, prefix).start()

    def heal_cursor(self, prefix: bytes) -> HealCursor:
        """The cursor of an unconstrained hole that must first produce `prefix`."""
        if self._prefix_masks is None:
            self._prefix_masks = PrefixMasks(self.backend.vocabulary)
        return HealCursor(self._prefix_masks, prefix)


def _evaluate_pattern(constraint: ir.Regex, scope: Mapping[str, Any], source: Source,
                      budget: Budget | None) -> str:
    value = evaluate(constraint.pattern, scope, source, budget)
    if not isinstance(value, str):
        raise EvaluationError(f"regex must be a string, got {type(value).__name__}",
                              constraint.pattern.span, source)
    return value


def _parse_schema(text: str, constraint: ir.JsonSchema, source: Source) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"json schema string is not valid JSON: {exc}",
                              constraint.schema.span, source) from None
