"""Branches (docs/language.md §23.1): `{% fork x in items %}` runs its body once per item, each
run a branch that continues independently from the run's context, and `{{ gen NAME n=N }}`
is N branches of one hole.

The context is fed once (Session.share), then each branch gets a session whose token ids copy
the run's and whose KV cache is a fork of its cache (KVCache.fork: the shared prefix is never
fed again), its own scope (the fork's variables and `loop` bound), its own random generator
(from the run's and the branch's index, so a seed replays every branch) and its own text,
which is dropped. Branches run in threads, at most MAX_CONCURRENT_BRANCHES at a time, and
their forwards join the run's own scheduler (its runner's, qrun/runtime/runner.py) as workers
of their own; on a backend that batches itself (vLLM), or that samples whole holes (a server),
they call it concurrently. Afterwards their captures (lists, in item order), hole
records, `holes.NAME` endings, trace holes and counters join the run's, in branch order; the
first failing branch (in order) fails the run with its own positioned error."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from qrun.errors import EvaluationError
from qrun.lang import ir
from qrun.lang.args import is_count
from qrun.lang.builtins import type_name
from qrun.lang.evaluate import LoopInfo
from qrun.limits import SharedBudget
from qrun.runtime.contexts import BlockRun, bind_targets, join_calls, mark_holes, reported_at
from qrun.runtime.engines import Engines, choose_engines
from qrun.runtime.recorder import Recorder
from qrun.runtime.scheduler import ForwardScheduler, ScheduledModel
from qrun.runtime.stats import Stats
from qrun.source import Span

MAX_CONCURRENT_BRANCHES = 16
"""Branches advanced together (one thread each; more wait for one to finish): a batch of 16
rows already keeps a CPU or GPU forward busy, and llama.cpp has 256 sequences for all runs."""

SEED_RANGE = 2**63
# Counters that describe the run's own context or the whole run, not work a branch adds
# (branch_tokens: all a branch fed is counted so, its own nested branches included).
_NOT_ADDED = frozenset({"context_tokens", "seed", "wall_s", "load_s", "branch_tokens"})


def exec_fork(run: BlockRun, op: ir.Fork) -> None:
    """Run `op.body` once per item as branches from the run's context (see the module)."""
    items = _items(run, op)
    if not items:
        return
    tail = share(run, op.span)
    names = frozenset(o.name for o in ir.walk(op.body) if isinstance(o, ir.Gen | ir.Select))
    # One draw from the run's generator per fork: branches of later forks (and of forks in
    # a loop) get other seeds, and the run's seed still replays them all.
    base = int(run.generator.integers(SEED_RANGE))
    branches = [Branch(index, item) for index, item in enumerate(items)]

    steps, output = run.budget.steps_left, run.budget.output_left
    # A top-level fork's branches each get a copy of the run's budget, and spend this one
    # together: nested forks cannot multiply the run's limits while the branches run.
    shared = None if run.in_branch else SharedBudget(steps, output)

    def one(branch: Branch, engines: Engines) -> None:
        _run_branch(run, op, branch, len(items), engines, base, names, tail, shared)

    if run.in_branch:
        # A fork inside a branch (a nested fork, a recursive macro's) runs its branches one
        # after the other in this branch's thread, on this branch's budget: threads stay at
        # MAX_CONCURRENT_BRANCHES per fork of the run, and a fork that recurses spends one
        # budget instead of a fresh copy per branch (which grows as fan-out ** depth).
        for branch in branches:
            one(branch, run.engines)
            if branch.error is not None:
                break
    else:
        drive(run, branches, one)
    run.session.append_text(tail)  # the context goes on as before the block
    for branch in branches:
        if branch.error is not None:
            with reported_at(run, op.span):  # a backend's own error, at the fork
                raise branch.error
    for branch in branches:
        assert branch.child is not None, "every branch ran"
        _merge(run, op, branch.index, branch.child, names)
        if not run.in_branch:  # else they spent this run's own budget
            pay(run, op.span, branch.child, steps, output)


def pay(run: BlockRun, span: Span, child: BlockRun, steps: int, output: int) -> None:
    """What a top-level branch (`child`) spent of the budget it started with (`steps`,
    `output` left) is the run's to pay; the limit's error, if any, is at `span`."""
    run.budget.output_left -= output - child.budget.output_left
    run.budget.output("")  # fails when the branches emitted more than the run may
    run.budget.step(span, steps - child.budget.steps_left)


@dataclass(eq=False)
class Branch:
    """One branch: its index and item, and once it has run, its Run (or the error that
    ended it)."""

    index: int
    item: Any
    child: BlockRun | None = None
    error: BaseException | None = None


def _items(run: BlockRun, op: ir.Fork) -> list[Any]:
    """The items to branch over (for `gen n=`: range(n)), checked as a loop's are."""
    value = run.evaluate(op.iterable)
    if op.samples:
        if not is_count(value):
            raise EvaluationError(f"n must be a positive integer, got {value!r}",
                                  op.iterable.span, run.source)
        value = range(value)
    if isinstance(value, dict):
        value = list(value)
    if not isinstance(value, list | tuple | str | range):
        raise EvaluationError(f"cannot fork over {type_name(value)}", op.iterable.span,
                              run.source)
    run.budget.loop(len(value), op.span)
    return list(value)


def share(run: BlockRun, span: Span) -> str:
    """Feed the whole context once, before it is forked, but its last token's text, returned
    (Session.share); failures are reported at `span`."""
    with reported_at(run, span):
        return run.session.share()


def _run_branch(parent: BlockRun, op: ir.Fork, branch: Branch, count: int, engines: Engines,
                base: int, names: frozenset[str], tail: str,
                shared: SharedBudget | None) -> None:
    """Run one branch to its end in the calling thread; its error is kept, not raised. `tail`
    is the shared context's last text, not in the fork (Session.share)."""
    stats = Stats()
    recorder = Recorder(parent.recorder.vocab, parent.recorder.detailed)
    session = None
    try:  # the fork too: llama.cpp may be out of sequences (the thread would die silently)
        session = parent.session.fork(engines.model, stats, recorder)
        session.append_text(tail)
        child = parent.branch(session, engines, stats, recorder,
                              np.random.default_rng([base, branch.index]), names)
        branch.child = child
        if shared is not None:
            child.budget.shared = shared
        bind_targets(child.scope, op.targets, branch.item, op.span, child.source)
        child.scope["loop"] = LoopInfo(branch.index, count)
        child.exec_block(op.body)
    except BaseException as exc:  # the run raises it (the first in branch order)
        branch.error = exc
    finally:
        if session is not None:
            session.close()


def _merge(run: BlockRun, op: ir.Fork, index: int, child: BlockRun, names: frozenset[str]) -> None:
    """Join one finished branch into the run: captures, records, endings, trace holes, particles
    blocks and counters."""
    for name in sorted(names):
        run.vars[name].extend(child.vars[name])
        run.scope[name] = run.vars[name]
        run.hole_lists[name].extend(child.hole_lists[name])
        run.endings[name].extend(child.endings[name])
    first = len(run.recorder.holes)
    run.recorder.holes.extend(child.recorder.holes)
    mark_holes(run.recorder, first, f"branch {index + 1} of fork {op.span}")
    join_calls(run.recorder, child.recorder, f"branch {index + 1} of fork {op.span}")
    run.recorder.blocks.extend(child.recorder.blocks)  # its particles blocks, in branch order
    add_stats(run.stats, child.stats)


def add_stats(into: Stats, part: Stats) -> None:
    """Add the counters of `part` (a branch's work) to `into`: every position it fed is one
    the run's context does not hold (branch_tokens)."""
    for item in fields(Stats):
        if item.name not in _NOT_ADDED:
            setattr(into, item.name, getattr(into, item.name) + getattr(part, item.name))
    into.branch_tokens += part.forward_tokens


def drive(run: BlockRun, branches: list[Branch], one: Callable[[Branch, Engines], None]
           ) -> None:
    """Run every branch (`one`) in worker threads, their forwards batched where the backend
    takes batches, until all have ended."""
    model = run.engines.model
    if not isinstance(model, ScheduledModel):  # vLLM batches itself; a server samples holes
        _Workers(branches, one, lambda _: run.engines, None).run()
        return
    # The run's forwards go through its runner's scheduler (qrun/runtime/runner.py): the
    # branches join it as workers of their own, their rows after the run's in branch order.
    workers = _Workers(branches, one, lambda i: _engines(run, model.branch(i)), model.scheduler)
    workers.start()
    model.scheduler.leave()  # while waiting, this run submits nothing
    try:
        workers.join()
    finally:
        model.scheduler.enter()


def _engines(run: BlockRun, model: ScheduledModel) -> Engines:
    """A branch's engines: the run's, with forwards (and select trees) through `model`, a
    ScheduledModel."""
    tree = model if model.scheduler.tree_scorer is not None else None
    return choose_engines(run.backend, model, tree)


class _Workers:
    """Up to MAX_CONCURRENT_BRANCHES threads taking the next branch until none is left; each
    counted by `scheduler` (when given) from before it starts until it ends."""

    def __init__(self, branches: list[Branch], one: Callable[[Branch, Engines], None],
                 engines: Callable[[int], Engines], scheduler: ForwardScheduler | None
                 ) -> None:
        self.queue: Iterator[Branch] = iter(branches)
        self.one = one
        self.engines = engines
        self.scheduler = scheduler
        self.lock = threading.Lock()  # guards queue
        self.threads = [threading.Thread(target=self.work, daemon=True)
                        for _ in range(min(len(branches), MAX_CONCURRENT_BRANCHES))]

    def run(self) -> None:
        self.start()
        self.join()

    def start(self) -> None:
        for thread in self.threads:
            if self.scheduler is not None:
                self.scheduler.enter()
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join()

    def take(self) -> Branch | None:
        with self.lock:
            return next(self.queue, None)

    def work(self) -> None:
        try:
            branch = self.take()
            while branch is not None:
                self.one(branch, self.engines(branch.index))
                branch = self.take()
        finally:
            if self.scheduler is not None:
                self.scheduler.leave()
