"""Hidden and fresh contexts (docs/language.md §23.3, §23.4): `{% hidden %}` runs its body in the
run's context and then takes the context back to where the block began (the KV cache cropped,
nothing fed again); `{% fresh %}` runs its body in a new, empty context and then goes on in the
run's own, untouched. Both keep their captures and leave their text out of the result (and out
of the stream). The run's recorder keeps their holes, marked with the context they ran in."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from qrun.backends.base import Backend
from qrun.errors import BackendError, ContextTooLong, EvaluationError, GenerationError
from qrun.lang import ir
from qrun.lang.builtins import type_name
from qrun.lang.expr import Expr
from qrun.limits import Budget
from qrun.options import Resolved
from qrun.runtime.calls import CallingRun, CallRunner
from qrun.runtime.engines import Engines
from qrun.runtime.recorder import Recorder
from qrun.runtime.result import HoleRecord
from qrun.runtime.session import ContextFull, Session
from qrun.runtime.speculate import PromptLookup
from qrun.runtime.stats import Stats
from qrun.source import Source, Span


class BlockRun(CallingRun, Protocol):
    """What the blocks of this module and of runtime/branches.py use of a run: the
    executor's Run (runtime/executor.py), which dispatches to them (so they do not import
    it); what calls use of it too (a branch's macros run in the branch)."""

    backend: Backend
    options: Resolved
    engines: Engines
    session: Session
    stats: Stats
    recorder: Recorder
    drafter: PromptLookup | None
    on_text: Callable[[str], None] | None
    pieces: list[str]
    source: Source
    budget: Budget
    generator: np.random.Generator
    scope: dict[str, Any]
    vars: dict[str, Any]
    holes: dict[str, HoleRecord]
    hole_lists: dict[str, list[HoleRecord]]
    endings: dict[str, Any]
    calls: CallRunner
    in_branch: bool  # a fork branch's run (runtime/branches.py)
    in_role: str | None  # the chat turn being run (runtime/executor.py)
    last_text: tuple[Span, Source]

    def exec_block(self, ops: Sequence[ir.Op], after: str | None = None) -> None: ...

    def evaluate(self, expr: Expr) -> Any: ...

    def show(self, text: str) -> None: ...

    def branch(self, session: Session, engines: Engines, stats: Stats, recorder: Recorder,
               generator: np.random.Generator, captures: frozenset[str]) -> BlockRun: ...


def bind_targets(scope: dict[str, Any], targets: tuple[str, ...], item: Any, span: Span,
                 source: Source) -> None:
    """Bind a loop's or a fork's variables to `item`, unpacking it for two or more (Python's
    rules: exactly as many values as names); none for `gen n=`'s branches."""
    if not targets:
        return
    if len(targets) == 1:
        scope[targets[0]] = item
        return
    if not isinstance(item, list | tuple | str):
        raise EvaluationError(f"cannot unpack a {type_name(item)} into {len(targets)} names",
                              span, source)
    if len(item) != len(targets):
        raise EvaluationError(f"cannot unpack {len(item)} values into {len(targets)} names",
                              span, source)
    scope.update(zip(targets, item, strict=True))


@contextmanager
def reported_at(run: BlockRun, span: Span) -> Iterator[None]:
    """A context too long for the model (ContextTooLong), or a backend failure, in the block
    is reported at `span` (a block's tag)."""
    try:
        yield
    except ContextFull as exc:
        raise ContextTooLong(str(exc), span, run.source) from None
    except BackendError as exc:
        raise GenerationError(str(exc), span, run.source) from None


def settle_at(run: BlockRun, span: Span) -> None:
    """Tokenize the text collected so far and resolve a pending overshoot; failures are
    reported at `span` (reported_at)."""
    with reported_at(run, span):
        run.session.settle()


@contextmanager
def unseen(run: BlockRun) -> Iterator[None]:
    """Text emitted inside is neither streamed nor kept in the result text."""
    on_text, pieces = run.on_text, len(run.pieces)
    run.on_text = None
    try:
        yield
    finally:
        run.on_text = on_text
        del run.pieces[pieces:]


def mark_holes(recorder: Recorder, first: int, context: str) -> None:
    """The holes recorded from index `first` on ran in `context` (the trace says so)."""
    for entry in recorder.holes[first:]:
        entry.context = context if entry.context is None else f"{context}; {entry.context}"


def join_calls(recorder: Recorder, inner: Recorder, context: str) -> None:
    """The host calls `inner` recorded (a branch's, a fresh block's) join `recorder`'s, marked
    as made in `context`."""
    for call in inner.calls:
        call.context = context if call.context is None else f"{context}; {call.context}"
        recorder.calls.append(call)


def exec_hidden(run: BlockRun, op: ir.Hidden) -> None:
    """Run the body, then take the context back to where it began. Token healing inside the
    block stops at its start (a hole there cannot take back the text before it), so the
    context is exactly the one before the block, fed as far as it was."""
    settle_at(run, op.span)
    session = run.session
    # The last token's text goes back in before the block and after it (Session.take_tail),
    # so the text on either side is read with it, as without the block.
    text = session.take_tail()
    start, fixed = len(session.token_ids), session.fixed_tail
    session.fixed_tail = 0
    session.append_text(text)
    first = len(run.recorder.holes)
    try:
        with unseen(run):
            run.exec_block(op.body)
    finally:
        session.take_back(start, fixed)
        session.append_text(text)
        mark_holes(run.recorder, first, "hidden")


def exec_fresh(run: BlockRun, op: ir.Fresh) -> None:
    """Run the body in a new session (same model, counters and prefix cache; its own
    recorder, whose holes join the run's), then go back to the run's session as it was: its
    collected text, overshoot and KV cache untouched."""
    main, recorder, drafter, last_text = run.session, run.recorder, run.drafter, run.last_text
    role, run.in_role = run.in_role, None  # the new context has no turn open
    inner = Recorder(recorder.vocab, recorder.detailed)
    main.pause()  # the new context feeds next, not this one (vLLM: its live request ends)
    run.session = Session(run.backend, run.engines.model, run.stats, main.prefix_cache, inner)
    run.recorder = inner
    stats = run.stats
    fed, aside = stats.forward_tokens, stats.branch_tokens
    if drafter is not None:
        run.drafter = PromptLookup(drafter.min_rate)
    try:
        with unseen(run):
            run.exec_block(op.body)
    finally:
        run.session.close()
        # What the block fed is beside the run's context (its own branches counted already).
        stats.branch_tokens += (stats.forward_tokens - fed) - (stats.branch_tokens - aside)
        run.session, run.recorder, run.drafter = main, recorder, drafter
        run.in_role = role
        run.last_text = last_text
        first = len(recorder.holes)
        recorder.holes.extend(inner.holes)
        mark_holes(recorder, first, "fresh")
        join_calls(recorder, inner, "fresh")
        recorder.blocks.extend(inner.blocks)
