"""The evaluation budget of one run (docs/language.md "Limits"): Limits is the frozen setting a
caller passes with the run options; Budget is the per-run counter that lang/evaluate.py and
runtime/executor.py charge, so a template from an untrusted source cannot hang a run.

The unit is a step, about a microsecond of interpreter work (measured on the tiny model:
an empty loop iteration ~1 us, `{% set y = i + 1 %}` ~3 us for its 5 steps). Work that
grows with a value's size is charged by size, and appending text to the context by piece
(each piece is tokenized: ~25-50 us with the Hugging Face tokenizer), so that the default
budget ends any template in about a second."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from qrun.errors import LimitError, UsageError
from qrun.source import Source, Span

if TYPE_CHECKING:
    from qrun.constraint import ConstraintLimits

ITEMS_PER_STEP = 4
"""Building, comparing, measuring or printing a list or dict costs a step per 4 items (entries
and scalars, counted through nested lists as if printed)."""
CHARS_PER_STEP = 1024
"""... and a step per 1024 characters of the strings involved."""
EMIT_STEPS = 32
"""Appending one piece of text (fixed text, a `{{ value }}`, a chat marker) to the context."""
MAX_VALUE_DEPTH = 200
"""Lists and dicts a template builds nest at most this deep (`{% set x = [x] %}` in a loop)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one run may do. The defaults never bother a real template (a prompt that fits a
    model's context) and end a runaway one in about a second; raise them for bigger jobs.

    steps: expression nodes evaluated + loop iterations + template ops executed, plus size
        charges (ITEMS_PER_STEP, CHARS_PER_STEP, EMIT_STEPS).
    output_chars: characters of text the template itself emits (fixed text, `{{ value }}`s,
        chat markers; not the text holes generate, which max_tokens bounds).
    int_bits: every integer an operation or function computes stays below 2**int_bits.
    grammar_chars, grammar_depth, optional_properties: how large a constraint may be
        (characters of a Lark grammar, its longest chain of rules, the optional properties
        of a JSON Schema at one place of the value): qrun/constraint/grammar/limits.py,
        whose defaults these are.
    call_depth: macro calls (and `call` of template files) nest at most this deep.
    call_timeout_s: a host function call (qrun.Functions) taking longer fails with a
        positioned error (None: no timeout, and a sync function runs on the run's thread).
    """

    steps: int = 1_000_000
    output_chars: int = 1_000_000
    int_bits: int = 10_000
    grammar_chars: int = 100_000
    grammar_depth: int = 500
    optional_properties: int = 4_000
    call_depth: int = 40
    call_timeout_s: float | None = 60.0

    def __post_init__(self) -> None:
        for name in ("steps", "output_chars", "int_bits", "grammar_chars", "grammar_depth",
                     "optional_properties", "call_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"Limits.{name} must be a positive integer, got {value!r}")
        timeout = self.call_timeout_s
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or not timeout > 0):
            raise UsageError("Limits.call_timeout_s must be a positive number of seconds or "
                             f"None, got {timeout!r}")

    def constraints(self) -> ConstraintLimits:
        """The constraint limits among these, for check_lark/check_schema and the grammar
        cache (qrun/constraint/grammar/limits.py; imported here on use, so that qrun.limits
        stays free of llguidance)."""
        from qrun.constraint import ConstraintLimits

        return ConstraintLimits(grammar_chars=self.grammar_chars,
                                grammar_depth=self.grammar_depth,
                                optional_properties=self.optional_properties)


class LimitExceeded(ValueError):
    """A budget or size limit was hit inside an expression; lang/evaluate.py turns it into an
    EvaluationError at the node being evaluated. `field` names the Limits field that would
    allow more (None for the fixed size limits)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SharedBudget:
    """What the branches of one top-level fork may spend together, while they run at once
    (runtime/branches.py): the steps and characters their run had left at the fork. Each
    branch also keeps its own Budget, which the run pays at the merge; without this, a fork
    of 100 branches, each with a copy of the budget, nesting forks of 100 x 100, ran for
    minutes before the merge found it over (issue #38). Thread-safe."""

    def __init__(self, steps: int, chars: int) -> None:
        self.steps_left = steps
        self.output_left = chars
        self.lock = threading.Lock()

    def spend(self, steps: int, chars: int = 0) -> str | None:
        """Take `steps` and `chars`; the limit's field that ran out, if one did."""
        with self.lock:
            self.steps_left -= steps
            self.output_left -= chars
            if self.output_left < 0:
                return "output_chars"
            return "steps" if self.steps_left < 0 else None


class Budget:
    """The steps and output characters left to one run (never shared between runs); in a
    top-level fork's branch, `shared` is what the branches may spend together."""

    def __init__(self, limits: Limits, source: Source) -> None:
        self.limits = limits
        self.source = source
        self.steps_left = limits.steps
        self.output_left = limits.output_chars
        self.where: Span | None = None  # the op being executed, where output is reported
        self.shared: SharedBudget | None = None

    def charge(self, steps: int) -> None:
        """Spend `steps` inside an expression.

        Raises:
            LimitExceeded: the run has no steps left.
        """
        self.steps_left -= steps
        if self.steps_left < 0 or (self.shared is not None and self.shared.spend(steps)):
            raise LimitExceeded(self._steps_message(), "steps")

    def step(self, span: Span, steps: int = 1) -> None:
        """Spend `steps` on the op (or loop iteration) at `span`, which is where output it
        emits is reported.

        Raises:
            EvaluationError: the run has no steps left.
        """
        self.where = span
        self.steps_left -= steps
        if self.steps_left < 0 or (self.shared is not None and self.shared.spend(steps)):
            self._fail(self._steps_message(), span, "steps")

    def loop(self, iterations: int, span: Span) -> None:
        """Before a loop of `iterations` (each costs at least a step): refuse at once one
        that cannot finish, without building its items.

        Raises:
            EvaluationError: more iterations than steps left.
        """
        if iterations > self.steps_left:
            self._fail(f"this loop has {iterations:,} iterations, more than the "
                       f"{max(self.steps_left, 0):,} steps left of the run's "
                       f"{self.limits.steps:,}", span, "steps")

    def output(self, text: str) -> None:
        """Spend a piece of emitted text (EMIT_STEPS and its characters), reported at the op
        being executed.

        Raises:
            EvaluationError: the run would emit more than `output_chars`, or has no steps left.
        """
        span = self.where if self.where is not None else self.source.span_at(0)
        self.output_left -= len(text)
        if self.output_left < 0 or (self.shared is not None
                                    and self.shared.spend(0, len(text)) == "output_chars"):
            self._fail(f"the template would emit more than {self.limits.output_chars:,} "
                       "characters of text", span, "output_chars")
        self.step(span, EMIT_STEPS)

    def output_fits(self, chars: int) -> bool:
        """Whether `chars` more characters of output are within the budget (checked before
        a large value is converted to text)."""
        return chars <= self.output_left

    def _steps_message(self) -> str:
        return f"the run took more than {self.limits.steps:,} evaluation steps"

    def _fail(self, message: str, span: Span, field: str) -> NoReturn:
        raise LimitError(message, span, self.source, [raise_note(field)])


def raise_note(field: str) -> str:
    """How to raise a limit: the note under every budget error."""
    return (f"a runaway template? If not, allow more with run(limits=Limits({field}=...)) "
            "(qrun.limits.Limits)")


# ---- what work costs ---------------------------------------------------------------------------


def size_cost(items: int, chars: int) -> int:
    """Steps for work over `items` items and `chars` characters (see measure)."""
    return items // ITEMS_PER_STEP + chars // CHARS_PER_STEP


def measure(value: Any) -> tuple[int, int]:
    """(items, characters) of a value as if printed: list and dict entries and scalars are
    items, strings count their characters. Nested containers are counted every time they
    occur, but each distinct container is visited once (memo by id), so shared structure such
    as `[[x] * 1000] * 1000` costs O(distinct containers) to measure."""
    if isinstance(value, str):
        return 0, len(value)
    memo: dict[int, tuple[int, int]] = {}

    def visit(item: Any, depth: int) -> tuple[int, int]:
        if isinstance(item, str):
            return 0, len(item)
        if not isinstance(item, (list, tuple, Mapping)):
            return 1, 0
        if id(item) in memo:
            return memo[id(item)]
        if depth > MAX_VALUE_DEPTH:
            raise LimitExceeded(f"value nested too deeply (more than {MAX_VALUE_DEPTH} levels)")
        items, chars = len(item), 0
        for child in (item.items() if isinstance(item, Mapping) else ((v,) for v in item)):
            for part in child:
                more_items, more_chars = visit(part, depth + 1)
                items += more_items
                chars += more_chars
        memo[id(item)] = items, chars
        return items, chars

    return visit(value, 0)


def compare_cost(op: str, left: Any, right: Any) -> int:
    """Steps for one comparison, by the work Python does for it: two containers compare item
    by item through nesting (their printed size); `x in list` compares x with each item."""
    if op in ("is", "is not"):
        return 0
    if isinstance(left, str) and isinstance(right, str):
        return (len(left) + len(right)) // CHARS_PER_STEP
    containers = (list, tuple, Mapping)
    if op in ("in", "not in") and isinstance(right, (list, tuple)) \
            and not isinstance(left, containers):
        width = len(left) if isinstance(left, str) else 0
        return len(right) // ITEMS_PER_STEP + len(right) * width // CHARS_PER_STEP
    if isinstance(left, containers) and isinstance(right, containers):
        if op in ("in", "not in") and isinstance(right, Mapping):
            return 0  # a hash lookup
        return size_cost(*measure(left)) + size_cost(*measure(right))
    return 0
