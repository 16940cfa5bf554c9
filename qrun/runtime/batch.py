"""Batched runs: up to B runs of one program advance together, each in its own thread with its
own session, constraint state and holes. On a backend that batches itself (vLLM, a server) the
runs call it directly; otherwise their forwards meet in a scheduler that feeds them to the model
as one batch (per-row cache lengths, padding hidden by an attention mask)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qrun.backends.base import Backend
from qrun.errors import QrunError
from qrun.functions import Functions
from qrun.lang.ir import Program
from qrun.options import RunOptions
from qrun.runtime.constraints import ConstraintCompiler
from qrun.runtime.engines import choose_engines
from qrun.runtime.executor import Run
from qrun.runtime.result import Result
from qrun.runtime.scheduler import ForwardScheduler, ScheduledModel

__all__ = ["ForwardScheduler", "Outcome", "ScheduledModel", "run_batched"]

Outcome = Result | QrunError


def run_batched(
    program: Program,
    backend: Backend,
    inputs: Sequence[Mapping[str, Any]],
    options: Sequence[RunOptions],
    constraints: ConstraintCompiler,
    batch_size: int,
    on_result: Callable[[int, Outcome], None] | None = None,
    functions: Functions | None = None,
    fills: Sequence[Mapping[str, Any]] | None = None,
) -> list[Outcome]:
    """Run `program` once per input (with the options and known values of the same index), up
    to `batch_size` runs at a time sharing each forward.

    The first run starts alone: its first forward fills the prefix cache with the template's
    leading text, which the others then reuse instead of encoding it again in the batch.
    A failing run puts its error in its place; the others complete.
    """
    return _BatchRun(program, backend, inputs, options, constraints, on_result,
                     functions, fills).run(batch_size)


class _BatchRun:
    """One call of `run_batched`: the runs of a program over its inputs, their outcomes in input
    order, and the threads that advance them. Worker threads take the next input (`take`), run
    it (`one`) and record its outcome, until none is left (`worker`); a launcher thread starts the
    lead worker alone, then the others once the lead's first forward is done (`launch`), while
    the calling thread serves the scheduler's batched forwards."""

    def __init__(self, program: Program, backend: Backend, inputs: Sequence[Mapping[str, Any]],
                 options: Sequence[RunOptions], constraints: ConstraintCompiler,
                 on_result: Callable[[int, Outcome], None] | None,
                 functions: Functions | None = None,
                 fills: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.program = program
        self.functions = functions
        self.fills = fills  # known values per input (runtime/fills.py), or None
        self.backend = backend
        self.inputs = inputs
        self.options = options
        self.constraints = constraints
        self.on_result = on_result
        self.outcomes: list[Outcome | None] = [None] * len(inputs)
        self.scheduler: ForwardScheduler | None = None
        model = backend.step_model()
        if model is not None and not backend.capabilities.batches_itself:
            self.scheduler = ForwardScheduler(model, backend.tree_scorer(),
                                              backend.batch_forward())
        self.next_index = 0
        self.lock = threading.Lock()  # guards next_index, taken by every worker
        self.finished = threading.Event()  # set when every worker has ended
        self.lead_run: Run | None = None  # the first run built (the lead worker's)
        self.threads: list[threading.Thread] = []

    def run(self, batch_size: int) -> list[Outcome]:
        """Every input's outcome, in input order, up to `batch_size` runs at a time."""
        launcher = threading.Thread(target=self.launch, args=(batch_size,), daemon=True)
        launcher.start()
        if self.scheduler is not None:
            self.scheduler.serve(self.finished.is_set)
        launcher.join()
        done = [o for o in self.outcomes if o is not None]
        assert len(done) == len(self.outcomes), "every run records a result or an error"
        return done

    def take(self) -> int | None:
        """The index of the next input to run, or None when every one is taken."""
        with self.lock:
            if self.next_index >= len(self.inputs):
                return None
            self.next_index += 1
            return self.next_index - 1

    def one(self, index: int) -> Outcome:
        """Run input `index`: its result, or the error that ended it."""
        try:
            if self.scheduler is not None:
                scheduled = ScheduledModel(self.scheduler, index)
                tree = scheduled if self.scheduler.tree_scorer is not None else None
                engines = choose_engines(self.backend, scheduled, tree)
            else:
                engines = choose_engines(self.backend)
            run = Run(self.program, self.backend, self.inputs[index], self.options[index],
                      None, self.constraints, engines, self.functions,
                      self.fills[index] if self.fills is not None else None)
            if self.lead_run is None:
                self.lead_run = run
            return run.execute()
        except QrunError as exc:
            return exc
        except Exception as exc:  # a bug: report it in this run's place, keep the others
            return QrunError(f"internal error: {type(exc).__name__}: {exc}")

    def worker(self, first: int | None) -> None:
        """A worker thread: run `first` (else the next input), then the next, until none is
        left; each outcome is recorded and reported as it comes."""
        try:
            index = first if first is not None else self.take()
            while index is not None:
                outcome = self.one(index)
                self.outcomes[index] = outcome
                if self.on_result is not None:
                    self.on_result(index, outcome)
                index = self.take()
        finally:
            if self.scheduler is not None:
                self.scheduler.leave()

    def start(self, first: int | None) -> None:
        """Start a worker thread (counted by the scheduler before it can submit a forward)."""
        if self.scheduler is not None:
            self.scheduler.enter()
        thread = threading.Thread(target=self.worker, args=(first,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def lead_called_once(self) -> bool:
        """The lead run's first forward is done (and in the prefix cache): with the scheduler,
        when it asks for its second; on a self-batching backend, when one has returned."""
        if self.scheduler is not None:
            return self.scheduler.submitted >= 2
        return self.lead_run is not None and self.lead_run.stats.forward_calls >= 1

    def launch(self, batch_size: int) -> None:
        """The launcher thread: the lead worker alone, then the others once its first forward
        is done (or it has ended); `finished` once every worker has."""
        first = self.take()
        if first is None:
            self.finished.set()
            return
        self.start(first)
        while not self.lead_called_once() and self.threads[0].is_alive():
            time.sleep(0.02)  # a poll: the lead's forward count is not something to wait on
        for _ in range(min(batch_size, len(self.inputs)) - 1):
            self.start(None)
        for thread in self.threads:
            thread.join()
        self.finished.set()
