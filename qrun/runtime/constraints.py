"""From a hole's constraint (IR) to a mask cursor: evaluates the pattern, schema or grammar for
this run, checks it as the compiler checks literals, and compiles token indexes once per
backend (shared by every run) with the hole's engine: qrun's DFA for regexes (masks.py),
llguidance for JSON Schemas and Lark grammars (llg.py)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from qrun.backends.base import Backend
from qrun.constraint.grammar import (
    JsonFormat,
    check_lark,
    check_schema,
    json_grammar,
    lark_grammar,
    with_prefix,
)
from qrun.constraint.grammar_index import LlgCache
from qrun.constraint.healing import HealCursor, PrefixMasks
from qrun.constraint.regex_index import IndexCache
from qrun.constraint.spec import PATTERN_TYPES, ConstraintSpec, Cursor
from qrun.errors import ConstraintError, EvaluationError
from qrun.lang import ir
from qrun.lang.evaluate import evaluate
from qrun.lang.expr import Expr
from qrun.limits import Budget
from qrun.source import Source

# Schemas and grammars checked per compiler (a hole in a loop is checked once).
_CHECKED_MAX = 256


class ConstraintCompiler:
    """Token indexes for one backend's vocabulary, built lazily and cached."""

    def __init__(self, backend: Backend, max_indexes: int = 64) -> None:
        self.backend = backend
        self.indexes = IndexCache(max_indexes)
        self.grammars = LlgCache(max_indexes)
        self._prefix_masks: PrefixMasks | None = None
        self._checked: OrderedDict[tuple[str, str], ConstraintSpec | str] = OrderedDict()
        self._lock = threading.Lock()

    def spec(
        self, constraint: ir.Constraint, scope: Mapping[str, Any], source: Source,
        budget: Budget | None = None,
    ) -> ConstraintSpec:
        """What a constraint stands for in this run, checked.

        Raises:
            ConstraintError: a JSON Schema or a grammar llguidance cannot compile.
            EvaluationError: the pattern, schema or grammar expression fails or has the
                wrong type.
        """
        match constraint:
            case ir.Regex(stdlib_name=str(name)):
                return ConstraintSpec(_evaluate_pattern(constraint, scope, source, budget),
                                      f"regex={name}", PATTERN_TYPES.get(name, "text"))
            case ir.Regex():
                pattern = _evaluate_pattern(constraint, scope, source, budget)
                return ConstraintSpec(pattern, f"regex={json.dumps(pattern)}")
            case ir.JsonSchema():
                return self._schema_spec(constraint, scope, source, budget)
            case ir.Grammar():
                return self._grammar_spec(constraint, scope, source, budget)

    def cursor(self, spec: ConstraintSpec, prefix: bytes = b"") -> Cursor:
        """A fresh cursor at the start of the constraint, which first requires the healed
        `prefix` (text taken back from the context) when one is given.

        Raises:
            PatternError: the pattern cannot be compiled to a token mask.
            GrammarError: llguidance cannot compile the grammar over this vocabulary.
        """
        vocab = self.backend.vocabulary
        if spec.engine == ir.LLGUIDANCE:
            text = with_prefix(spec.pattern, prefix.decode("utf-8", errors="replace"))
            return self.grammars.get(text, vocab).start()
        return self.indexes.get(spec.pattern, vocab, prefix).start()

    def heal_cursor(self, prefix: bytes) -> HealCursor:
        """The cursor of an unconstrained hole that must first produce `prefix`."""
        if self._prefix_masks is None:
            self._prefix_masks = PrefixMasks(self.backend.vocabulary)
        return HealCursor(self._prefix_masks, prefix)

    def _schema_spec(self, constraint: ir.JsonSchema, scope: Mapping[str, Any], source: Source,
                     budget: Budget | None) -> ConstraintSpec:
        schema = evaluate(constraint.schema, scope, source, budget)
        if isinstance(schema, str):
            schema = _parse_schema(schema, constraint, source)
        if not isinstance(schema, dict | bool):
            raise EvaluationError(
                f"json must be a JSON Schema object, got {type(schema).__name__}",
                constraint.schema.span, source)
        closed = False
        if constraint.closed is not None:
            closed = evaluate(constraint.closed, scope, source, budget)
            if not isinstance(closed, bool):
                raise EvaluationError(f"closed must be true or false, got {closed!r}",
                                      constraint.closed.span, source)
        try:
            text = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=True)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConstraintError(f"JSON Schema: {exc}", constraint.schema.span,
                                  source) from None
        description = f"json={text}" + (" closed=true" if closed else "")
        fmt = JsonFormat(closed=closed)

        def build() -> ConstraintSpec | str:
            error = check_schema(schema, fmt)
            if error is not None:
                return f"JSON Schema: {error}"
            return ConstraintSpec(json_grammar(schema, fmt), description, "json", ir.LLGUIDANCE)

        return self._checked_spec(("json", description), build, constraint.schema, source)

    def _grammar_spec(self, constraint: ir.Grammar, scope: Mapping[str, Any], source: Source,
                      budget: Budget | None) -> ConstraintSpec:
        text = evaluate(constraint.grammar, scope, source, budget)
        if not isinstance(text, str) or not text.strip():
            raise EvaluationError(f"grammar must be a non-empty string (a Lark grammar), got "
                                  f"{type(text).__name__}", constraint.grammar.span, source)

        def build() -> ConstraintSpec | str:
            error = check_lark(text)
            if error is not None:
                return f"grammar: {error}"
            description = "grammar=" + json.dumps(text, ensure_ascii=False)
            return ConstraintSpec(lark_grammar(text), description, "text", ir.LLGUIDANCE)

        return self._checked_spec(("grammar", text), build, constraint.grammar, source)

    def _checked_spec(self, key: tuple[str, str], build: Callable[[], ConstraintSpec | str],
                      where: Expr, source: Source) -> ConstraintSpec:
        """The spec built by `build` (or its refusal), remembered per compiler."""
        with self._lock:
            found = self._checked.get(key)
        if found is None:
            found = build()
            with self._lock:
                self._checked[key] = found
                if len(self._checked) > _CHECKED_MAX:
                    self._checked.popitem(last=False)
        if isinstance(found, str):
            raise ConstraintError(found, where.span, source)
        return found


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
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConstraintError(f"json schema string is not valid JSON: {exc}",
                              constraint.schema.span, source) from None
