"""execute(program, backend, inputs) -> Result: walks the IR, appending fixed text to the
session and filling holes; one handler per op."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import torch

from qrun.backends.base import Backend, HoleSampler
from qrun.errors import (
    BackendError,
    ConstraintError,
    EvaluationError,
    GenerationError,
    InputError,
    TemplateCompileError,
)
from qrun.lang import ir
from qrun.lang.evaluate import LoopInfo, evaluate, evaluate_text
from qrun.lang.expr import Expr
from qrun.lang.inputs import plain_inputs
from qrun.lang.limits import Budget, Limits
from qrun.runtime.constraints import ConstraintCompiler
from qrun.runtime.dfa import PatternError
from qrun.runtime.generate import Cursor, GenRequest, HoleFailure, HoleRecord, generate
from qrun.runtime.healing import healable_tail
from qrun.runtime.portable import escape, portable_regex
from qrun.runtime.remote import generate_remote
from qrun.runtime.result import Result
from qrun.runtime.sampler import SamplingParams
from qrun.runtime.select import SelectRequest, select
from qrun.runtime.session import Session
from qrun.runtime.stats import Stats
from qrun.source import Span

DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Run-wide settings; None falls back to the template's front matter, then the defaults
    (temperature 0, top_p 1, seed 0, max_tokens 128)."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    limits: Limits = Limits()

    def resolve(self, defaults: ir.RunDefaults) -> RunOptions:
        def pick(mine: Any, front: Any, builtin: Any) -> Any:
            return mine if mine is not None else front if front is not None else builtin

        return RunOptions(
            temperature=pick(self.temperature, defaults.temperature, 0.0),
            top_p=pick(self.top_p, defaults.top_p, 1.0),
            seed=pick(self.seed, defaults.seed, 0),
            max_tokens=pick(self.max_tokens, defaults.max_tokens, DEFAULT_MAX_TOKENS),
            limits=self.limits,
        )


def check_inputs(program: ir.Program, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Raise InputError naming every missing input, before any model work; return the inputs
    the template reads as plain data (lang/inputs.py: a UsageError for any other value)."""
    missing = [name for name in program.inputs if name not in inputs]
    if not missing:
        return plain_inputs({name: inputs[name] for name in program.inputs})
    first = missing[0]
    span = _first_use(program.ops, first) or program.source.span_at(0)
    names = ", ".join(repr(m) for m in missing)
    raise InputError(
        f"missing input{'s' if len(missing) > 1 else ''} {names}",
        span,
        program.source,
        notes=[f"give it with -v {first}=VALUE, --vars FILE.json, or run({first}=...)"],
    )


def execute(
    program: ir.Program,
    backend: Backend,
    inputs: Mapping[str, Any],
    options: RunOptions = RunOptions(),
    on_text: Callable[[str], None] | None = None,
    constraints: ConstraintCompiler | None = None,
) -> Result:
    """Run a compiled program on a backend.

    Raises:
        InputError: a declared input is missing (before any model work).
        GenerationError: a hole cannot be filled legally.
        EvaluationError: an expression fails at run time.
    """
    inputs = check_inputs(program, inputs)
    runner = _Runner(program, backend, inputs, options.resolve(program.defaults), on_text,
                     constraints or ConstraintCompiler(backend))
    return runner.run()


class _Runner:
    def __init__(
        self,
        program: ir.Program,
        backend: Backend,
        inputs: Mapping[str, Any],
        options: RunOptions,
        on_text: Callable[[str], None] | None,
        constraints: ConstraintCompiler,
    ) -> None:
        self.program = program
        self.backend = backend
        self.options = options
        self.on_text = on_text
        self.constraints = constraints
        self.stats = Stats(load_s=backend.load_s)
        self.session = Session(backend, self.stats, backend.prefix_cache)
        self.scope: dict[str, Any] = dict(inputs)
        self.vars: dict[str, Any] = {}
        self.holes: dict[str, HoleRecord | list[HoleRecord]] = {}
        self.pieces: list[str] = []
        self.generator = torch.Generator().manual_seed(int(options.seed or 0))
        self.budget = Budget(options.limits, program.source)
        for name in _loop_captures(program.ops):
            # A loop capture exists (as a list) even when its loop never runs.
            self.vars[name] = self.scope[name] = []
            self.holes[name] = []

    def run(self) -> Result:
        started = time.perf_counter()
        if isinstance(self.backend, HoleSampler):
            self._check_portable()
        try:
            self._exec_block(self.program.ops)
            self.session.finish()
        finally:
            self.session.close()
        self.stats.wall_s = time.perf_counter() - started
        return Result("".join(self.pieces), self.vars, self.stats, self.holes,
                      list(self.session.token_ids))

    def _exec_block(self, ops: Sequence[ir.Op]) -> None:
        for op in ops:
            self.budget.step(op.span)
            self._exec(op)

    def _exec(self, op: ir.Op) -> None:
        match op:
            case ir.EmitText():
                self._emit(op.text)
            case ir.EmitValue():
                self._emit(evaluate_text(op.expr, self.scope, self.program.source, self.budget))
            case ir.Gen():
                self._exec_gen(op)
            case ir.Select():
                self._exec_select(op)
            case ir.If():
                self._exec_if(op)
            case ir.For():
                self._exec_for(op)
            case ir.Set():
                self.scope[op.name] = self._eval(op.expr)
            case ir.Role():
                self._exec_role(op)
            case _:
                assert_never(op)

    def _emit(self, text: str) -> None:
        if not text:
            return
        self.budget.output(text)
        self.session.append_text(text)
        self._show(text)

    def _show(self, text: str) -> None:
        self.pieces.append(text)
        if self.on_text is not None and text:
            self.on_text(text)

    def _eval(self, expr: Expr) -> Any:
        return evaluate(expr, self.scope, self.program.source, self.budget)

    def _exec_gen(self, op: ir.Gen) -> None:
        remote = isinstance(self.backend, HoleSampler)
        request = self._gen_request(op, remote)
        try:
            if isinstance(self.backend, HoleSampler):
                regex = self._portable_regex(op, request.prefix)
                record = generate_remote(self.session, self.backend, request, regex,
                                         op.params.constraint is not None, self._show)
            else:
                record = generate(self.session, request, self._show)
        except (HoleFailure, BackendError) as exc:
            raise GenerationError(str(exc), op.span, self.program.source) from None
        finally:
            self.session.pause()
        self._capture(op.name, record, op.in_loop)

    def _check_portable(self) -> None:
        """Before any model work: every constraint that can be known now (not built from
        captures) must have a form the server reads as qrun does."""
        for op in _walk(self.program.ops):
            if isinstance(op, ir.Gen) and op.params.constraint is not None:
                try:
                    self._portable_regex(op, b"")
                except EvaluationError:
                    pass  # depends on values not known yet: checked when the hole comes

    def _portable_regex(self, op: ir.Gen, prefix: bytes) -> str | None:
        """The hole's constraint (healed prefix first) as a regex a server reads the way qrun
        does; None for an unconstrained hole with nothing healed."""
        pattern = None
        if op.params.constraint is not None:
            pattern = self.constraints.pattern(op.params.constraint, self.scope,
                                               self.program.source, op.span)
        if pattern is None and not prefix:
            return None
        where = op.params.constraint.pattern.span if isinstance(
            op.params.constraint, ir.Regex) else op.span
        try:
            body = portable_regex(pattern) if pattern is not None else "[\\s\\S]*"
        except PatternError as exc:
            raise ConstraintError(f"this constraint cannot be sent to the server: {exc}",
                                  where, self.program.source) from None
        return escape(prefix.decode("utf-8")) + ("(?:" + body + ")" if prefix else body)

    def _gen_request(self, op: ir.Gen, remote: bool = False) -> GenRequest:
        p = op.params
        max_tokens = self._arg(p.max_tokens, int, self.options.max_tokens, op.span, "max_tokens")
        if max_tokens < 1:
            raise self._bad_arg(p.max_tokens, op.span, f"max_tokens must be ≥ 1, got {max_tokens}")
        stop = self._stop(p.stop, op.span)
        sampling, generator = self._sampling(p, op.span)
        prefix = b""
        # The healed token may stay in the context until the model writes it again: no extra
        # forward where one forward can return the logits of two positions (transformers).
        # On vLLM that costs a step of its own, and a server samples the whole hole: there it
        # is taken back.
        in_context = not remote and bool(getattr(self.backend, "heals_in_context", True))
        if self._arg(p.heal, bool, True, op.span, "heal"):
            prefix = self._heal(keep_last=in_context)
        cursor: Cursor | None = None
        if p.constraint is not None:
            cursor = self.constraints.cursor(p.constraint, self.scope, self.program.source,
                                             op.span, prefix)
        elif prefix:
            cursor = self.constraints.heal_cursor(prefix)
        return GenRequest(op.name, max_tokens, stop, sampling, generator, cursor, prefix,
                          healed_in_context=bool(prefix) and in_context)

    def _heal(self, keep_last: bool = False) -> bytes:
        """Token healing before a hole: take back the last fixed-text token when the model
        could have continued it, returning its bytes (the hole must produce them first).
        `keep_last`: see Session.heal."""
        self.session.settle()
        vocab = self.backend.vocabulary
        count = healable_tail(vocab, self.session.token_ids, self.session.fixed_tail)
        return self.session.heal(count, keep_last)

    def _sampling(
        self, p: ir.GenParams, span: Span
    ) -> tuple[SamplingParams, torch.Generator]:
        temperature = float(self._arg(p.temperature, (int, float), self.options.temperature,
                                      span, "temperature"))
        top_p = float(self._arg(p.top_p, (int, float), self.options.top_p, span, "top_p"))
        top_k = int(self._arg(p.top_k, int, 0, span, "top_k"))
        if temperature < 0:
            raise self._bad_arg(p.temperature, span, f"temperature must be ≥ 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise self._bad_arg(p.top_p, span, f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise self._bad_arg(p.top_k, span, f"top_k must be ≥ 0, got {top_k}")
        generator = self.generator
        if p.seed is not None:
            seed = self._arg(p.seed, int, 0, span, "seed")
            generator = torch.Generator().manual_seed(seed)
        return SamplingParams(temperature, top_p, top_k), generator

    def _stop(self, expr: Expr | None, span: Span) -> tuple[str, ...]:
        if expr is None:
            return ()
        value = self._eval(expr)
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops):
            raise self._bad_arg(expr, span, "stop must be a non-empty string or a list of them")
        return tuple(stops)

    def _arg(self, expr: Expr | None, kind: Any, default: Any, span: Span, name: str) -> Any:
        if expr is None:
            return default
        value = self._eval(expr)
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise self._bad_arg(expr, span, f"{name} has the wrong type: {value!r}")
        return value

    def _bad_arg(self, expr: Expr | None, span: Span, message: str) -> EvaluationError:
        where = expr.span if expr is not None else span
        return EvaluationError(message, where, self.program.source)

    def _exec_select(self, op: ir.Select) -> None:
        options = self._eval(op.options)
        if (not isinstance(options, list | tuple) or not options
                or not all(isinstance(o, str) and o for o in options)):
            raise self._bad_arg(op.options, op.span,
                                "options must be a non-empty list of non-empty strings")
        temperature = float(self._arg(op.temperature, (int, float), self.options.temperature,
                                      op.span, "temperature"))
        normalize = self._arg(op.normalize, str, "sum", op.span, "normalize")
        if normalize not in ("sum", "mean"):
            raise self._bad_arg(op.normalize, op.span, "normalize must be \"sum\" or \"mean\"")
        prefix = self._heal().decode("utf-8")
        request = SelectRequest(op.name, tuple(options), temperature, normalize, self.generator,
                                prefix)
        try:
            record = select(self.session, request)
        except (HoleFailure, BackendError) as exc:
            raise GenerationError(str(exc), op.span, self.program.source) from None
        finally:
            self.session.pause()
        self._show(record.value)
        self._capture(op.name, record, op.in_loop)
        logprobs = dict(record.option_logprobs or {})
        if op.in_loop:
            self.vars.setdefault(f"{op.name}__logprobs", []).append(logprobs)
        else:
            self.vars[f"{op.name}__logprobs"] = logprobs

    def _capture(self, name: str, record: HoleRecord, in_loop: bool) -> None:
        if in_loop:
            self.vars[name].append(record.value)
            holes = self.holes[name]
            assert isinstance(holes, list)
            holes.append(record)
            self.scope[name] = self.vars[name]
        else:
            self.vars[name] = record.value
            self.holes[name] = record
            self.scope[name] = record.value

    def _exec_if(self, op: ir.If) -> None:
        for branch in op.branches:
            if self._eval(branch.condition):
                self._exec_block(branch.body)
                return
        self._exec_block(op.orelse)

    def _exec_for(self, op: ir.For) -> None:
        items = self._eval(op.iterable)
        if isinstance(items, dict):
            items = list(items)
        if not isinstance(items, list | tuple | str | range):
            raise EvaluationError(f"cannot loop over {type(items).__name__}",
                                  op.iterable.span, self.program.source)
        self.budget.loop(len(items), op.span)
        items = list(items)
        saved = {k: self.scope[k] for k in (op.target, "loop") if k in self.scope}
        for index, item in enumerate(items):
            self.budget.step(op.span)
            self.scope[op.target] = item
            self.scope["loop"] = LoopInfo(index, len(items))
            self._exec_block(op.body)
        for key in (op.target, "loop"):
            self.scope.pop(key, None)
        self.scope.update(saved)

    def _exec_role(self, op: ir.Role) -> None:
        markers = self.backend.chat_markers(op.role)
        if markers is None:
            raise TemplateCompileError(
                f"the '{op.role}' role needs a chat template, and model '{self.backend.name}' "
                "has none", op.span, self.program.source,
                notes=["write the turn markers as fixed text, or use a chat model"])
        before, after = markers
        self._emit(before)
        self._exec_block(op.body)
        self.budget.step(op.span)  # output from here on is reported at the role
        self._emit(after)


def _loop_captures(ops: Sequence[ir.Op]) -> Iterator[str]:
    for op in _walk(ops):
        if isinstance(op, ir.Gen | ir.Select) and op.in_loop:
            yield op.name


def _walk(ops: Sequence[ir.Op]) -> Iterator[ir.Op]:
    for op in ops:
        yield op
        match op:
            case ir.If():
                for branch in op.branches:
                    yield from _walk(branch.body)
                yield from _walk(op.orelse)
            case ir.For() | ir.Role():
                yield from _walk(op.body)
            case _:
                pass


def _first_use(ops: Sequence[ir.Op], name: str) -> Span | None:
    for expr in _exprs(ops):
        for node in _expr_nodes(expr):
            if getattr(node, "name", None) == name and type(node).__name__ == "Name":
                return node.span  # type: ignore[no-any-return]
    return None


def _exprs(ops: Sequence[ir.Op]) -> Iterator[Expr]:
    for op in _walk(ops):
        match op:
            case ir.EmitValue() | ir.Set():
                yield op.expr
            case ir.For():
                yield op.iterable
            case ir.If():
                for branch in op.branches:
                    yield branch.condition
            case ir.Select():
                yield op.options
            case ir.Gen():
                for value in (op.params.max_tokens, op.params.stop, op.params.temperature):
                    if value is not None:
                        yield value
            case _:
                pass


def _expr_nodes(expr: Any) -> Iterator[Any]:
    yield expr
    for slot in getattr(type(expr), "__slots__", ()):
        child = getattr(expr, slot)
        items = child if isinstance(child, tuple) else (child,)
        for item in items:
            if isinstance(item, tuple):
                for sub in item:
                    if hasattr(sub, "span"):
                        yield from _expr_nodes(sub)
            elif hasattr(item, "span") and not isinstance(item, Span):
                yield from _expr_nodes(item)
