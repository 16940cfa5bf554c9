"""A hole's arguments evaluated when the hole runs: each checked by the table the compiler
checks literal arguments with (lang/args.py HOLE_ARG_CHECKS), so a value computed at run time
is held to what a literal is held to at --check, in the same words.

The executor (runtime/executor.py) evaluates a `gen` hole's arguments once, into GenArgs,
whether the model fills the hole or a known value does (runtime/fills.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qrun.errors import EvaluationError, UsageError
from qrun.lang import ir
from qrun.lang.args import (
    CONDITIONAL_REFUSES,
    HOLE_ARG_CHECKS,
    SMC_ARGS,
    sampler_conflict,
    show_value,
    weighing_conflict,
)
from qrun.lang.expr import Expr
from qrun.options import Resolved, logit_bias_items, reshaping
from qrun.runtime.sampler import SamplingParams
from qrun.source import Source, Span


@dataclass(frozen=True, slots=True)
class GenArgs:
    """A `gen` hole's arguments, or the run's options where the hole gives none. `seed`: the
    hole's own seed (None: the run's generator samples it)."""

    max_tokens: int
    stop: tuple[str, ...]
    keep_stop: bool
    heal: bool
    ends_at_text: bool
    sampling: SamplingParams
    seed: int | None
    # "mask", "exact" (runtime/exact.py), "smc" (runtime/particles.py) or, in a particles
    # block, "auto" (runtime/engines.py: exact where the language is small, else smc)
    sampler: str
    particles: int  # with sampler="smc"
    ess_threshold: float  # with sampler="smc"


class HoleArgs:
    """Evaluates the arguments of the hole at hand, in the scope `evaluate` reads; errors are
    EvaluationErrors at the argument, in `source`."""

    def __init__(self, evaluate: Callable[[Expr], Any], source: Source, options: Resolved,
                 vocab_size: int) -> None:
        self._evaluate = evaluate
        self._source = source
        self._options = options
        self._vocab_size = vocab_size  # the model's: logit_bias names tokens in it

    def gen(self, p: ir.GenParams) -> GenArgs:
        options = self._options
        if options.in_particles:
            given = {name: getattr(p, name) for name in ("temperature", "sampler",
                                                         *CONDITIONAL_REFUSES)
                     if getattr(p, name, None) is not None}
            sampler = self.value(p.sampler, "sampler", None)
            self._weighed("gen", given, ["regex"] if p.constraint is not None else [],
                          sampler)
        stop = self.value(p.stop, "stop", ())
        seed = self.value(p.seed, "seed", None)
        return GenArgs(
            max_tokens=self.value(p.max_tokens, "max_tokens", options.max_tokens),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            keep_stop=self.value(p.keep_stop, "keep_stop", False),
            heal=self.value(p.heal, "heal", True),
            ends_at_text=self.value(p.ends_at_text, "ends_at_text", True),
            sampling=SamplingParams(
                float(self.value(p.temperature, "temperature", options.temperature)),
                float(self.value(p.top_p, "top_p", options.top_p)),
                int(self.value(p.top_k, "top_k", options.top_k)),
                float(self.value(p.min_p, "min_p", options.min_p)),
                float(self.value(p.presence_penalty, "presence_penalty",
                                 options.presence_penalty)),
                float(self.value(p.frequency_penalty, "frequency_penalty",
                                 options.frequency_penalty)),
                float(self.value(p.repetition_penalty, "repetition_penalty",
                                 options.repetition_penalty)),
                self._logit_bias(p.logit_bias, options.logit_bias)),
            seed=None if seed is None else int(seed),
            sampler=self._sampler(p),
            particles=int(self.value(p.particles, "particles", options.particles)),
            ess_threshold=float(self.value(p.ess_threshold, "ess_threshold",
                                           options.ess_threshold)))

    def _sampler(self, p: ir.GenParams) -> str:
        """The hole's sampler: its own (`particles=` or `ess_threshold=` alone means "smc"),
        held to the compiler's check of a literal one (lang/args.py sampler_conflict); else the
        run's, for a constrained hole that gives no argument it refuses."""
        given = [name for name in (*CONDITIONAL_REFUSES, *SMC_ARGS)
                 if getattr(p, name, None) is not None]
        constraint = ["regex"] if p.constraint is not None else []
        smc = [getattr(p, name) for name in SMC_ARGS if getattr(p, name) is not None]
        if p.sampler is None and not smc:
            run = self._options.sampler
            return run if constraint and sampler_conflict(run, given + constraint) is None \
                else "mask"
        sampler = str(self.value(p.sampler, "sampler", "smc"))
        wrong: str | None = sampler_conflict(sampler, given + constraint)
        if wrong is None and sampler != "mask":
            # The run's (or front matter's) own: a hole's were refused above.
            option = reshaping(self._options)
            if option is not None:
                wrong = (f'sampler="{sampler}" cannot be used with the run\'s {option}: it '
                         "draws from the model's own distribution")
        if wrong is not None:
            where = p.sampler or smc[0]
            raise EvaluationError(wrong, where.span, self._source)
        return sampler

    def _weighed(self, kind: str, given: dict[str, Expr], constraint: list[str],
                 sampler: str | None) -> None:
        """In a `{% particles %}` block, a hole (a macro's, which the compiler did not see
        there) takes only what weighing allows (lang/args.py weighing_conflict)."""
        wrong = weighing_conflict(kind, [*given, *constraint], sampler)
        if wrong is not None:
            raise EvaluationError(wrong[1], given[wrong[0]].span, self._source)

    def _logit_bias(self, expr: Expr | None, default: tuple[tuple[int, float], ...]
                    ) -> tuple[tuple[int, float], ...]:
        value = self.value(expr, "logit_bias", None)
        items = default if value is None else logit_bias_items(value) or ()
        outside = [token for token, _ in items if token >= self._vocab_size]
        if outside:
            message = (f"logit_bias names token {outside[0]}, outside the model's vocabulary "
                       f"(token ids 0 to {self._vocab_size - 1})")
            if expr is None:
                raise UsageError(message)
            raise EvaluationError(message, expr.span, self._source)
        return items

    def select_options(self, op: ir.Select) -> list[str]:
        """The options of a select: wanted before its known value is checked against them."""
        return list(self.value(op.options, "options", None))

    def select_scoring(self, op: ir.Select) -> tuple[float, str]:
        """How a select the model fills scores its options: temperature and normalize."""
        if self._options.in_particles:
            given = {name: expr for name, expr in (("temperature", op.temperature),
                                                    ("normalize", op.normalize))
                     if expr is not None}
            self._weighed("select", given, [], None)
        temperature = self.value(op.temperature, "temperature", self._options.temperature)
        return float(temperature), str(self.value(op.normalize, "normalize", "sum"))

    def value(self, expr: Expr | None, name: str, default: Any) -> Any:
        """The value of argument `name`, checked, or `default` where the hole omits it."""
        if expr is None:
            return default
        value = self._evaluate(expr)
        wanted = HOLE_ARG_CHECKS[name](value)
        if wanted is not None:
            # A computed list is not repeated in the message: it may be long (50,000 select
            # options), and the error points at the expression that made it.
            got = "" if isinstance(value, list | tuple | dict) else f", got {show_value(value)}"
            raise EvaluationError(f"{name} must be {wanted}{got}", expr.span, self._source)
        return value


def text_after(ops: Sequence[ir.Op], index: int, after: str | None) -> str | None:
    """The template text that is sure to come next after `ops[index]` runs: the next op's when
    it is fixed text (past `set`s, which emit nothing), `after` when the block ends first, None
    where it depends on the run (a value, a loop's next round, another hole)."""
    for op in ops[index + 1 :]:
        if isinstance(op, ir.Set):
            continue
        return op.text if isinstance(op, ir.EmitText) and op.text else None
    return after


def constraint_span(op: ir.Gen) -> Span:
    """Where an error about `op`'s constraint points: its constraint argument's value."""
    match op.params.constraint:
        case ir.Regex(pattern=expr) | ir.JsonSchema(schema=expr) | ir.Grammar(grammar=expr) | \
                ir.ToolCall(tools=expr):
            return expr.span
    return op.span
