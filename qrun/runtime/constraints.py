"""From a hole's constraint (IR) to a mask cursor. A literal constraint was lowered by the
compiler (its spec is in the IR); one the template computes is evaluated for this run and
lowered here (qrun/constraint/spec.py lower, remembered per value). Token indexes are compiled
once per backend and shared by every run: qrun's DFA for regexes (regex_index.py), llguidance
for JSON Schemas and Lark grammars (grammar_index.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend
from qrun.constraint import (
    ConstraintLimits,
    ConstraintSpec,
    Cursor,
    IndexCache,
    JsonFormat,
    JsonFormatError,
    LlgCache,
    LoweringError,
    lower,
)
from qrun.constraint.grammar import FIXED, with_prefix
from qrun.constraint.grammar.limits import DEFAULT as DEFAULT_LIMITS
from qrun.constraint.healing import HealCursor, PrefixMasks
from qrun.constraint.spec import DFA, LLGUIDANCE
from qrun.constraint.tools import DEFAULT_KEYS, CallKeys
from qrun.errors import ConstraintError, EvaluationError
from qrun.lang import ir
from qrun.lang.evaluate import Calls, evaluate
from qrun.lang.expr import Expr
from qrun.limits import Budget
from qrun.source import Source


class ConstraintCompiler:
    """Token indexes for one backend's vocabulary, built lazily and cached."""

    def __init__(self, backend: Backend, max_indexes: int = 64) -> None:
        self.backend = backend
        self.indexes = IndexCache(max_indexes)
        self.grammars = LlgCache(max_indexes)
        self._prefix_masks: PrefixMasks | None = None

    def spec(
        self, constraint: ir.Constraint, scope: Mapping[str, Any], source: Source,
        budget: Budget | None = None, calls: Calls | None = None,
    ) -> ConstraintSpec:
        """What a constraint stands for in this run, checked; `calls` are the run's macros
        and host functions (none before the run starts: a constraint that calls one is
        evaluated when its hole comes).

        Raises:
            ConstraintError: a pattern, JSON Schema or grammar its engine refuses.
            EvaluationError: the pattern, schema or grammar expression fails or has the
                wrong type.
        """
        limits = budget.limits.constraints() if budget is not None else DEFAULT_LIMITS
        lowered = constraint.lowered
        if isinstance(constraint, ir.ToolCall) and self.call_keys() != DEFAULT_KEYS:
            lowered = None  # the compiler wrote the default call; this model writes its own
        if lowered is not None and (lowered.engine == DFA or lowered.limits == limits):
            return lowered  # the compiler's (a regex's size is no constraint limit's)
        # A named pattern (regex=INT) is never here: the compiler lowers it (lang/args.py),
        # and a regex's spec is kept whatever the run's limits.
        match constraint:
            case ir.Regex(pattern=expr):
                return _lowered("regex", evaluate(expr, scope, source, budget, calls), expr, source,
                                FIXED, limits)
            case ir.JsonSchema(schema=expr, closed=closed_expr, formats=formats_expr) | ir.ToolCall(
                    tools=expr, closed=closed_expr, formats=formats_expr):
                # A tool's arguments are closed unless the hole says otherwise (lang/args.py).
                closed: Any = isinstance(constraint, ir.ToolCall)
                if closed_expr is not None:
                    closed = evaluate(closed_expr, scope, source, budget, calls)
                formats: Any = "assert"
                if formats_expr is not None:
                    formats = evaluate(formats_expr, scope, source, budget, calls)
                try:
                    fmt = JsonFormat.checked(closed, formats)
                except JsonFormatError as error:
                    wrong = closed_expr if error.name == "closed" else formats_expr
                    raise EvaluationError(str(error), (wrong or expr).span, source) from None
                schema = evaluate(expr, scope, source, budget, calls)
                if isinstance(constraint, ir.ToolCall):
                    return _lowered("tools", schema, expr, source, fmt, limits,
                                    self.call_keys())
                return _lowered("json", schema, expr, source, fmt, limits)
            case ir.Grammar(grammar=expr):
                grammar = evaluate(expr, scope, source, budget, calls)
                return _lowered("grammar", grammar, expr, source, FIXED, limits)

    def call_keys(self) -> CallKeys:
        """How this model writes a tool call's object: its chat template's keys, else the
        default `{"name": ..., "arguments": ...}` (docs/language.md §7.7)."""
        found = self.backend.tool_call_format()
        return found.keys if found is not None else DEFAULT_KEYS

    def cursor(self, spec: ConstraintSpec, prefix: bytes = b"") -> Cursor:
        """A fresh cursor at the start of the constraint, which first requires the healed
        `prefix` (text taken back from the context) when one is given.

        Raises:
            PatternError: the pattern cannot be compiled to a token mask.
            GrammarError: llguidance cannot compile the grammar over this vocabulary.
        """
        vocab = self.backend.vocabulary
        if spec.engine == LLGUIDANCE:
            text = with_prefix(spec.pattern, prefix.decode("utf-8", errors="replace"))
            return self.grammars.get(text, vocab, spec.limits).start()
        return self.indexes.get(spec.pattern, vocab, prefix).start()

    def heal_cursor(self, prefix: bytes) -> HealCursor:
        """The cursor of an unconstrained hole that must first produce `prefix`."""
        return HealCursor(self._masks(), prefix)

    def first_tokens(self, prefix: bytes) -> npt.NDArray[np.bool_]:
        """The tokens a hole healed to `prefix` may begin with: those holding all of it."""
        return self._masks().holding(prefix)

    def _masks(self) -> PrefixMasks:
        if self._prefix_masks is None:
            self._prefix_masks = PrefixMasks(self.backend.vocabulary)
        return self._prefix_masks


def _lowered(kind: str, value: Any, where: Expr, source: Source, fmt: JsonFormat,
             limits: ConstraintLimits, keys: CallKeys = DEFAULT_KEYS) -> ConstraintSpec:
    """The spec of a value the template computed, its errors at the expression's span: a
    value of the wrong type is an evaluation error, one its engine refuses a constraint
    error."""
    try:
        return lower(kind, value, fmt, limits, keys=keys)
    except LoweringError as error:
        kind_of_error = EvaluationError if error.wrong_type else ConstraintError
        notes = list(error.notes)
        if error.limit is not None:
            notes.append(f"raise the limit with run(..., limits=qrun.Limits({error.limit}=...)) "
                         "(docs/language.md §14.9)")
        raise kind_of_error(error.message, where.span, source, notes) from None
