"""Run(request, ...).execute() -> Result: walks the IR, appending fixed text to the session and
filling holes through the engines chosen for the run (runtime/engines.py); one handler per op.
Runs are built by qrun/runtime/runner.py alone."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, assert_never

import numpy as np

from qrun.backends.base import Backend
from qrun.constraint import Cursor
from qrun.constraint.grammar import GrammarError
from qrun.errors import (
    BackendError,
    ConstraintError,
    ContextTooLong,
    EvaluationError,
    GenerationError,
    LimitError,
    TemplateCompileError,
    UsageError,
    ValueCutOff,
)
from qrun.lang import ir
from qrun.lang.declared import first_problem, where
from qrun.lang.evaluate import LoopInfo, evaluate, evaluate_text
from qrun.lang.expr import Expr
from qrun.limits import Budget
from qrun.regex import PatternError
from qrun.runtime.branches import exec_fork
from qrun.runtime.calls import CallRunner, MacroReturn, Mark
from qrun.runtime.constraints import ConstraintCompiler
from qrun.runtime.contexts import bind_targets, exec_fresh, exec_hidden
from qrun.runtime.engines import Engines
from qrun.runtime.fills import check_gen_fill, check_select_fill, fill_text
from qrun.runtime.healing import healable_tail
from qrun.runtime.hole import GenRequest, HoleFailure
from qrun.runtime.hole_args import HoleArgs, constraint_span, text_after
from qrun.runtime.particle_block import exec_particles
from qrun.runtime.recorder import Recorder
from qrun.runtime.request import RunRequest
from qrun.runtime.result import GenRecord, HoleRecord, Result, SelectRecord
from qrun.runtime.sampler import new_generator
from qrun.runtime.scheduler import ScheduledModel
from qrun.runtime.select import SelectRequest, select
from qrun.runtime.session import ContextFull, Session
from qrun.runtime.speculate import PromptLookup
from qrun.runtime.stats import Stats
from qrun.runtime.tool_calls import (
    Pieces,
    call_format,
    call_value,
    checked_tools,
    system_pieces,
)
from qrun.source import Source, Span


class Run:
    """One run of a program: its session, scope and records. `stats` is live while it runs
    (batched runs watch the lead run's forwards)."""

    def __init__(self, request: RunRequest, backend: Backend, constraints: ConstraintCompiler,
                 engines: Engines) -> None:
        """Built only by qrun/runtime/runner.py, from a request whose inputs and known values
        are checked already (Query.request)."""
        program = request.program
        self.fills = request.fills.fresh()  # known values (runtime/fills.py)
        self.program = program
        self.backend = backend
        self.options = request.options.resolved()
        self.on_text = request.on_text
        self.constraints = constraints
        self.engines = engines
        self.stats = Stats(load_s=backend.load_s, seed=self.options.seed)
        self.recorder = Recorder(backend.vocabulary, detailed=self.options.trace)
        model = self.engines.model
        self.session = Session(backend, model, self.stats,
                               model.prefix_cache if model is not None else None, self.recorder)
        self.scope: dict[str, Any] = dict(request.inputs)
        # `holes.NAME`: how each hole so far ended (docs/language.md §7.6)
        self.endings: dict[str, Any] = {}
        self.scope["holes"] = self.endings
        self.vars: dict[str, Any] = {}
        self.holes: dict[str, HoleRecord] = {}
        self.hole_lists: dict[str, list[HoleRecord]] = {}
        self.pieces: list[str] = []
        self.generator = new_generator(self.options.seed)
        self.source = program.source  # what the op being run points into (an included file's)
        # Where the last fixed text came from: a ContextFull at its tokenizing is reported there.
        self.last_text: tuple[Span, Source] = (program.source.span_at(0), program.source)
        self.budget = Budget(self.options.limits, program.source)
        speculate = (self.options.speculate and self.engines.model is not None
                     and backend.capabilities.lookahead)
        self.drafter = PromptLookup(backend.capabilities.draft_cost) if speculate else None
        self.quiet = 0  # inside a hidden stretch (runtime/calls.py): its text is not streamed
        self.calls = CallRunner(self, request.functions)
        self.in_branch = False  # a fork branch's run (runtime/branches.py)
        self.in_role: str | None = None  # the chat turn being run, if any
        # Told each top-level capture as its hole ends (a server's hole events), and each piece
        # of a top-level hole's sampled text (the name of the hole being filled); not a macro's.
        self.on_hole: Callable[[str, Any], None] | None = request.on_hole
        self.on_value = request.on_value
        self.filling: str | None = None  # the top-level hole being filled, for on_value
        self._top_vars = self.vars
        self._start_lists(program.ops)

    def branch(self, session: Session, engines: Engines, stats: Stats, recorder: Recorder,
               generator: np.random.Generator, captures: frozenset[str]) -> Run:
        """A fork branch's run (runtime/branches.py): this run's program, options,
        constraints, scope and captures so far, with its own session, engines, counters,
        trace, random generator and text (dropped), and its own empty lists for the fork's
        `captures`, joined into this run's afterwards. A branch of a branch shares its
        budget; a top-level fork's branches each get a copy (not one per level of nesting,
        which would grow as fan-out ** depth)."""
        child = copy.copy(self)
        child.session, child.engines, child.stats, child.recorder = (session, engines, stats,
                                                                     recorder)
        child.calls = self.calls.for_branch(child)  # macros called there run in the branch
        child.generator = generator
        child.on_text = None
        child.pieces = []
        child.budget = self.budget if self.in_branch else copy.copy(self.budget)
        child.in_branch = True
        # Branches batched by the scheduler do not speculate (docs/language.md §14.10): a
        # batched step costs its widest row, so one branch's guesses widen every row, and
        # guesses from the shared prefix are mostly refused (measured with bench.branches:
        # more positions fed and no wall time saved).
        batched = isinstance(engines.model, ScheduledModel)
        child.drafter = (PromptLookup(self.drafter.min_rate)
                         if self.drafter is not None and not batched else None)
        child.scope = dict(self.scope)
        child.vars, child.holes = dict(self.vars), dict(self.holes)
        child.hole_lists = dict(self.hole_lists)
        child.endings = dict(self.endings)
        child.scope["holes"] = child.endings
        for name in captures:
            child.vars[name] = child.scope[name] = []
            child.hole_lists[name] = []
            child.endings[name] = []
        return child

    def _start_lists(self, ops: Sequence[ir.Op]) -> None:
        """A loop capture exists (as a list) even when its loop never runs (a macro's, in
        each call)."""
        for op, _ in ir.holes(ops, self.source):
            if op.in_loop:
                self.vars[op.name] = self.scope[op.name] = []
                self.hole_lists[op.name] = []
                self.endings[op.name] = []

    def enter_scope(self, scope: dict[str, Any], source: Source) -> tuple[Any, ...]:
        """Run what follows (a macro's body) with `scope` and captures of its own, in `source`;
        returns what leave_scope restores."""
        saved = (self.scope, self.vars, self.holes, self.hole_lists, self.endings, self.source)
        self.scope, self.vars, self.holes, self.hole_lists = scope, {}, {}, {}
        self.endings = {}
        self.scope["holes"] = self.endings
        self.source = self.budget.source = source
        return saved

    def leave_scope(self, saved: tuple[Any, ...]) -> None:
        self.scope, self.vars, self.holes, self.hole_lists, self.endings, self.source = saved
        self.budget.source = self.source

    def exec_body(self, ops: Sequence[ir.Op], after: str | None = None) -> None:
        """A macro's body (or a called file's): its loop captures start as empty lists;
        `after` as for exec_block."""
        self._start_lists(ops)
        self.exec_block(ops, after)

    def aside(self) -> AbstractContextManager[None]:
        """A block with no forward (a host call) out of the batch: ScheduledModel.aside."""
        model = self.engines.model
        return model.aside() if isinstance(model, ScheduledModel) else nullcontext()

    def check(self) -> None:
        """What is checked before any model work: host calls, constraints, known values."""
        self.calls.check()
        self._check_constraints()
        self._check_fills()

    def execute(self) -> Result:
        started = time.perf_counter()
        self.check()
        try:
            self.exec_block(self.program.ops)
            self.flush_text()
            self.session.finish()
        finally:
            self.session.close()
        self.stats.wall_s = time.perf_counter() - started
        backend = self.backend
        header = {"template": self.program.source.name, "model": backend.name,
                  "backend": backend.kind, "device": backend.device, "dtype": backend.dtype}
        return Result("".join(self.pieces), self.vars, self.stats, self.holes, self.hole_lists,
                      list(self.session.token_ids), self.recorder, header, self._output())

    def _output(self) -> dict[str, Any] | None:
        """The typed result record of a template with `output:` (docs/language.md §4.2),
        checked against it: the compiler proved each hole's values fit, so only a capture a
        path of the template never bound can fail here.

        Raises:
            GenerationError: the record does not fit the output schema.
        """
        schema = self.program.output_schema
        if schema is None:
            return None
        record = {name: self.vars[name] for name in schema.get("properties", {})
                  if name in self.vars}
        problem = first_problem(schema, record)
        if problem is not None:
            path, message = problem
            missing = [n for n in schema.get("required", ()) if n not in record]
            name = path[0] if path else missing[0] if missing else None
            span, source = self._hole_of(name) if isinstance(name, str) else (None, None)
            raise GenerationError(f"the result does not fit the template's output schema"
                                  f"{where(path)}: {message}",
                                  span or self.program.source.span_at(0),
                                  source or self.program.source)
        return record

    def _hole_of(self, name: str) -> tuple[Span | None, Source | None]:
        """The span (and its file) of the first hole of the template that captures `name`;
        (None, None) when there is none."""
        for op, source in ir.holes(self.program.ops, self.program.source):
            if op.name == name:
                return op.span, source
        return None, None

    def _check_constraints(self) -> None:
        """Before any model work: every constraint that can be known now (not built from
        captures) must be one the hole filler can take."""
        for op, source in ir.walk_sources(self.program.ops, self.program.source):
            if isinstance(op, ir.Gen) and op.params.constraint is not None:
                constraint = op.params.constraint
                try:
                    spec = self.constraints.spec(constraint, self.scope, source, self.budget)
                except EvaluationError:
                    continue  # depends on values not known yet: checked when the hole comes
                filler = self.engines.filler
                refusal = filler.refuses(spec) if filler is not None else None
                if refusal is not None:
                    raise ConstraintError(refusal, constraint_span(op), source)

    def _check_fills(self) -> None:
        """Before any model work: each known value whose hole's arguments are known now
        (not built from captures) fits its hole (its first value, for a loop's hole). A name
        with holes both in and out of loops is checked at each hole when the run reaches it:
        its list fits only the loop's, and a branch may never run."""
        holes = [op for op, _ in ir.holes(self.program.ops, self.program.source)]
        mixed = {op.name for op in holes if op.in_loop} & \
            {op.name for op in holes if not op.in_loop}
        for op in holes:
            if op.name not in self.fills.values or op.name in mixed:
                continue
            value = self.fills.values[op.name]
            if op.in_loop:
                if not value:
                    continue
                value = value[0]
            try:
                if isinstance(op, ir.Select):
                    check_select_fill(op, value, self._hole_args().select_options(op),
                                      self.source)
                else:
                    self._check_gen_fill(op, value)
            except EvaluationError:
                continue  # depends on values not known yet: checked when the hole comes

    # ---- ops -------------------------------------------------------------------------------------

    def exec_block(self, ops: Sequence[ir.Op], after: str | None = None) -> None:
        """Run `ops`; `after` is the template text known to follow the block (a chat turn's
        closing marker, the text after an `if`), or None."""
        for index, op in enumerate(ops):
            self.budget.step(op.span)
            self._exec(op, text_after(ops, index, after))

    def _exec(self, op: ir.Op, after: str | None = None) -> None:
        match op:
            case ir.EmitText():
                self.emit(op.text, special=True, op=op)
            case ir.EmitValue():
                if not self.calls.inline(op, after):
                    text = evaluate_text(op.expr, self.scope, self.source, self.budget,
                                         self.calls)
                    self.emit(text, op=op)
            case ir.Gen():
                self._exec_gen(op, after)
            case ir.Select():
                self._exec_select(op)
            case ir.If():
                self._exec_if(op, after)
            case ir.For():
                self._exec_for(op)
            case ir.Set():
                self.scope[op.name] = self.evaluate(op.expr)
            case ir.Role():
                self._exec_role(op)
            case ir.Break():
                raise _Break
            case ir.Continue():
                raise _Continue
            case ir.Include():
                self._exec_include(op, after)
            case ir.While():
                self._exec_while(op)
            case ir.Try():
                self._exec_try(op, after)
            case ir.Macro():
                pass  # defined here, run where called (runtime/calls.py)
            case ir.Return():
                self.calls.returned(self.evaluate(op.expr))
            case ir.Fork():
                exec_fork(self, op)
            case ir.Particles():
                exec_particles(self, op)
            case ir.Hidden():
                exec_hidden(self, op)
            case ir.Fresh():
                exec_fresh(self, op)
            case _:
                assert_never(op)

    def emit(self, text: str, special: bool = False, op: ir.Op | None = None) -> None:
        """Append text that is not the model's: only the template's own text (`special`) may
        spell control tokens; a value's text is always encoded as text."""
        if not text:
            return
        self.budget.output(text)
        self.last_text = (op.span if op is not None else self.source.span_at(0), self.source)
        try:
            self.session.append_text(text, special=special)
        except ContextFull as exc:
            where = op.span if op is not None else self.source.span_at(0)
            raise ContextTooLong(str(exc), where, self.source) from None
        self.show(text)

    def flush_text(self) -> None:
        """Tokenize the text collected since the last hole (Session.flush), before a hole or
        at the end; a context too long for the model is reported at that text."""
        try:
            self.session.flush()
        except ContextFull as exc:
            span, source = self.last_text
            raise ContextTooLong(str(exc), span, source) from None

    def show(self, text: str) -> None:
        self.pieces.append(text)
        if self.on_text is not None and text and not self.quiet:
            self.on_text(text)
        if self.on_value is not None and self.filling is not None and text and not self.quiet:
            self.on_value(self.filling, text)

    def evaluate(self, expr: Expr) -> Any:
        return evaluate(expr, self.scope, self.source, self.budget, self.calls)

    @contextmanager
    def _filling(self, op: ir.Gen | ir.Select) -> Iterator[None]:
        """Around filling a hole: failures become a GenerationError at the hole; afterwards
        the backend may let go of what it holds for the next token."""
        kind = "gen" if isinstance(op, ir.Gen) else "select"
        self.flush_text()
        self.recorder.begin_hole(op.name, kind, op.span.line, op.span.column)
        top = self.vars is self._top_vars and not self.in_branch
        self.filling = op.name if top else None
        try:
            yield
        except ContextFull as exc:  # the hole's tokens (or a select's options) ran out of room
            raise ContextTooLong(f"{exc}: hole '{op.name}' filled the rest of the context",
                                 op.span, self.source) from None
        except HoleFailure as exc:
            failure = ValueCutOff if exc.cut_off else GenerationError
            raise failure(str(exc), op.span, self.source) from None
        except (BackendError, GrammarError) as exc:
            raise GenerationError(str(exc), op.span, self.source) from None
        finally:
            self.filling = None
            self.session.pause()

    def _known(self, op: ir.Gen | ir.Select) -> tuple[bool, Any]:
        """A known value for this hole (`fill`): only the template's own holes take one."""
        if not self.fills or self.vars is not self._top_vars or self.in_branch:
            return False, None
        return self.fills.take(op)

    def _exec_gen(self, op: ir.Gen, after: str | None = None) -> None:
        known, value = self._known(op)
        if known:
            self._fill_gen(op, value)
            return
        filler = self.engines.filler
        if filler is None:
            raise GenerationError(f"model '{self.backend.name}' was loaded without weights (a "
                                  "tokenizer only), so it cannot fill holes", op.span,
                                  self.program.source)
        # A tool call in the model's own format: its chat template's text around the JSON
        # (runtime/tool_calls.py), which is the template's text the model reads next.
        call = call_format(self.backend, op)
        if call is not None:
            self.emit(call.prefix, special=True, op=op)
            after = call.suffix or after
        with self._filling(op):
            request = self._gen_request(op, after)
            record = self.engines.fill(self.session, request, self.show)
        if isinstance(op.params.constraint, ir.ToolCall):
            record.value = call_value(record.value, self.constraints.call_keys())
        self.recorder.end_hole(constraint=record.constraint, value=record.value, text=record.text,
                               finish=record.finish, seconds=record.seconds, **record.drawn_from())
        self._capture(op.name, record, op.in_loop)
        if call is not None:
            self.emit(call.suffix, special=True, op=op)

    def _hole_args(self) -> HoleArgs:
        return HoleArgs(self.evaluate, self.source, self.options, self.backend.vocabulary.size)

    def _gen_request(self, op: ir.Gen, after: str | None = None) -> GenRequest:
        p = op.params
        args = self._hole_args().gen(p)
        generator = self.generator if args.seed is None else new_generator(args.seed)
        spec = None
        if p.constraint is not None:
            spec = self.constraints.spec(p.constraint, self.scope, self.source,
                                         self.budget, self.calls)
        prefix = b""
        # The healed token may stay in the context until the model writes it again where one
        # forward returns two positions' logits, else it is taken back (backends/base.py).
        in_context = self.engines.heals_in_context and args.sampler == "mask"
        if args.heal:
            prefix = self._heal(keep_last=in_context)
        cursor: Cursor | None = None
        if spec is not None:
            try:
                cursor = self.constraints.cursor(spec, prefix)
            except (PatternError, GrammarError) as exc:
                raise ConstraintError(str(exc), constraint_span(op), self.source) from None
        elif prefix:
            cursor = self.constraints.heal_cursor(prefix)
        # A hole may end where the model begins the template's next text
        # (docs/language.md §14.5): a constrained one always, an unconstrained one where no
        # stop of its own says where it ends; ends_at_text=false turns this off.
        follow = None
        if args.ends_at_text and (spec is not None or not args.stop):
            follow = after
        first = self.constraints.first_tokens(prefix) if prefix else None
        return GenRequest(op.name, args.max_tokens, args.stop, args.sampling, generator, cursor,
                          spec, prefix, healed_in_context=bool(prefix) and in_context,
                          drafter=self.drafter, follow=follow, keep_stop=args.keep_stop,
                          first_tokens=first, sampler=args.sampler, particles=args.particles,
                          ess_threshold=args.ess_threshold)

    def _fill_gen(self, op: ir.Gen, value: Any) -> None:
        """A `gen` hole given its value: checked against the hole, then fixed text."""
        text, typed, description, stop = self._check_gen_fill(op, value)
        record = GenRecord(op.name, typed, text, start=len(self.session.token_ids),
                           finish="filled", constraint=description, stop=stop)
        self._emit_filled(op, record, description)

    def _check_gen_fill(self, op: ir.Gen, value: Any
                        ) -> tuple[str, Any, str | None, str | None]:
        """The text, typed value and constraint description of a known value for `op`, and
        the stop string it ends with where the hole keeps its stop (keep_stop=true): what the
        hole reports as its `stop` had the model written the same text, so `holes.NAME.stop`
        reads alike either way (docs/language.md §16.1).

        Raises:
            InputError: the value does not fit the hole (runtime/fills.py check_gen_fill).
            EvaluationError: an argument of the hole cannot be evaluated (yet).
        """
        p = op.params
        if isinstance(p.constraint, ir.ToolCall):
            raise UsageError(f"hole '{op.name}' is a tool call, which cannot be filled")
        args = self._hole_args().gen(p)
        spec = cursor = None
        if p.constraint is not None:
            spec = self.constraints.spec(p.constraint, self.scope, self.source, self.budget,
                                         self.calls)
            try:
                cursor = self.constraints.cursor(spec)
            except (PatternError, GrammarError) as exc:
                raise ConstraintError(str(exc), constraint_span(op), self.source) from None
        text = fill_text(op.name, value, spec)
        typed = check_gen_fill(op, text, spec, cursor, args.stop, args.keep_stop,
                               args.max_tokens, len(self.backend.encode(text)), self.source)
        stop = next((s for s in args.stop if text.endswith(s)), None) if args.keep_stop else None
        return text, typed, spec.description if spec is not None else None, stop

    def _emit_filled(self, op: ir.Gen | ir.Select, record: HoleRecord,
                     constraint: str | None) -> None:
        kind = "gen" if isinstance(op, ir.Gen) else "select"
        self.recorder.begin_hole(op.name, kind, op.span.line, op.span.column)
        self.emit(record.text, op=op)
        # A filled select scored no option: its trace lists none.
        extra: dict[str, Any] = {"options": []} if kind == "select" else {}
        self.recorder.end_hole(constraint=constraint, value=record.value, text=record.text,
                               finish="filled", seconds=0.0, **extra)
        self.stats.filled_holes += 1
        self._capture(op.name, record, op.in_loop)

    def _heal(self, keep_last: bool = False) -> bytes:
        """Token healing before a hole: take back the last fixed-text token when the model
        could have continued it, returning its bytes (the hole must produce them first).
        `keep_last`: see Session.heal."""
        self.session.settle()
        vocab = self.backend.vocabulary
        count = healable_tail(vocab, self.session.token_ids, self.session.fixed_tail)
        return self.session.heal(count, keep_last)

    def _exec_select(self, op: ir.Select) -> None:
        args = self._hole_args()
        options = args.select_options(op)
        known, value = self._known(op)
        if known:
            chosen = check_select_fill(op, value, options, self.source)
            description = "options=" + json.dumps(options, ensure_ascii=False)
            self._emit_filled(op, SelectRecord(op.name, chosen, chosen, finish="filled",
                                               start=len(self.session.token_ids)), description)
            return
        temperature, normalize = args.select_scoring(op)
        scoring = self.engines.scoring
        if scoring is None:
            raise GenerationError(f"backend '{self.backend.name}' cannot score select options",
                                  op.span, self.source)
        with self._filling(op):
            prefix = self._heal().decode("utf-8")
            request = SelectRequest(op.name, tuple(options), temperature, normalize,
                                    self.generator, prefix)
            record = select(self.session, request, scoring, self.engines.proposal)
            self.show(record.text)
        probs = record.option_probs
        self.recorder.end_hole(
            constraint="options=" + json.dumps(list(options), ensure_ascii=False),
            value=record.value, text=record.text, finish=record.finish, seconds=record.seconds,
            options=[(o, lp, probs[o]) for o, lp in record.option_logprobs.items()],
            log_importance=record.log_importance)
        self._capture(op.name, record, op.in_loop)

    def _capture(self, name: str, record: HoleRecord, in_loop: bool) -> None:
        ending = {"finish": record.finish, "stop": getattr(record, "stop", None),
                  "text": record.text}  # lang/evaluate.py HOLE_ENDING_FIELDS, which --check knows
        if in_loop:
            self.vars[name].append(record.value)
            self.hole_lists[name].append(record)
            self.endings[name].append(ending)
            self.scope[name] = self.vars[name]
        else:
            self.vars[name] = self.scope[name] = record.value
            self.holes[name] = record
            self.endings[name] = ending
        if self.on_hole is not None and self.vars is self._top_vars:
            self.on_hole(name, record.value)

    def _exec_if(self, op: ir.If, after: str | None) -> None:
        for branch in op.branches:
            if self.evaluate(branch.condition):
                self.exec_block(branch.body, after)
                return
        self.exec_block(op.orelse, after)

    def _exec_for(self, op: ir.For) -> None:
        items = self.evaluate(op.iterable)
        if isinstance(items, dict):
            items = list(items)
        if not isinstance(items, list | tuple | str | range):
            raise EvaluationError(f"cannot loop over {type(items).__name__}",
                                  op.iterable.span, self.source)
        self.budget.loop(len(items), op.span)
        items = list(items)
        names = (*op.targets, "loop")
        saved = {k: self.scope[k] for k in names if k in self.scope}
        # Jinja's scoping: a `set` in the body binds for the rest of that round only; every
        # round, and the template after the loop, sees the values from before it
        # (`{% set xs = xs + [i] %}` leaves xs as it was; docs/language.md §5).
        local = {o.name for o in ir.walk(op.body) if isinstance(o, ir.Set)} - set(names)
        before = {k: self.scope[k] for k in local if k in self.scope}
        for index, item in enumerate(items):
            self.budget.step(op.span)
            bind_targets(self.scope, op.targets, item, op.span, self.source)
            self.scope["loop"] = LoopInfo(index, len(items))
            try:
                self.exec_block(op.body)
            except _Continue:
                continue
            except _Break:
                break
            finally:
                for key in local:
                    self.scope.pop(key, None)
                self.scope.update(before)
        for key in names:
            self.scope.pop(key, None)
        self.scope.update(saved)

    def _exec_while(self, op: ir.While) -> None:
        """Each round costs a step: the run's budget ends a loop that never does."""
        while True:
            self.budget.step(op.span)
            if not self.evaluate(op.test):
                return
            try:
                self.exec_block(op.body)
            except _Continue:
                continue
            except _Break:
                return

    def _exec_try(self, op: ir.Try, after: str | None) -> None:
        """The text before the block is tokenized up to it (a seam, as before a hole: the
        body's text must be taken back alone). The body's text is held back from the stream
        until it succeeds; when it fails with an EvaluationError (not a limit), its text leaves
        the context and the result, and the handler runs with the message bound."""
        mark = Mark(self)
        try:
            self.exec_block(op.body, after)
        except LimitError:
            mark.release()
            raise
        except EvaluationError as err:
            mark.take_back()
            if op.name is None:
                self.exec_block(op.handler, after)
                return
            saved = {op.name: self.scope[op.name]} if op.name in self.scope else {}
            self.scope[op.name] = err.message
            try:
                self.exec_block(op.handler, after)
            finally:
                self.scope.pop(op.name, None)
                self.scope.update(saved)
            return
        except BaseException:
            mark.release()
            raise
        mark.release()

    def _exec_include(self, op: ir.Include, after: str | None) -> None:
        outer = self.source
        self.source = self.budget.source = op.source
        try:
            self.exec_block(op.body, after)
        finally:
            self.source = self.budget.source = outer

    def _exec_role(self, op: ir.Role) -> None:
        if self.in_role is not None:
            # The compiler refuses a turn written inside a turn; one reached through a macro
            # or a call() of a file is found here (a fresh block's context has none open).
            raise TemplateCompileError(
                f"a '{op.role}' turn cannot begin inside the '{self.in_role}' turn",
                op.span, self.source,
                notes=["end the turn before the call, or call it from outside the turn"])
        markers = self.backend.chat_markers(op.role)
        if markers is None:
            raise TemplateCompileError(
                f"the '{op.role}' role needs a chat template, and model '{self.backend.name}' "
                "has none", op.span, self.source,
                notes=["write the turn markers as fixed text, or use a chat model"])
        before: Pieces = ((markers[0], True),)
        after: Pieces = ((markers[1], True),)
        if op.tools is not None:  # the tools' text is data: never control tokens
            tools = checked_tools(self.evaluate(op.tools), op.tools.span, self.source)
            before, after = system_pieces(self.backend, tools, markers)
        for text, special in before:
            self.emit(text, special=special, op=op)
        follows = "".join(text for text, _ in after)
        self.in_role = op.role
        try:
            self.exec_block(op.body, follows)
        except (_LoopControl, MacroReturn):  # a break, continue or return inside the turn
            self.in_role = None                # still ends the turn
            self._end_role(op, after)
            raise
        finally:
            self.in_role = None
        self._end_role(op, after)

    def _end_role(self, op: ir.Role, after: Pieces) -> None:
        self.budget.step(op.span)  # output from here on is reported at the role
        for text, special in after:
            self.emit(text, special=special, op=op)


class _LoopControl(Exception):
    """A break or continue on its way to the loop it ends (ir.For's handler)."""


class _Break(_LoopControl):
    pass


class _Continue(_LoopControl):
    pass
