"""The one run path (docs/serve.md §3): `Runner.of(backend)`, one per loaded backend, runs every
RunRequest (qrun/runtime/request.py) of every face: `Query.run/arun/astream/run_many`, `qrun
serve`, `qrun test`. It owns the backend's constraint compiler (token indexes shared by every
run), its one ForwardScheduler (runtime/scheduler.py: the forwards of all its runs, and of their
branches, meet there as one batch per step), admission (runs up to `max_running` at a time, at
most `max_queue` waiting, cancellation) and the only construction of a run (executor.Run).

A run joins the batch at its first forward and leaves it when it ends; nothing waits for a
batch to fill. A backend that batches itself (vLLM) or samples whole holes (a server) gets the
runs' calls concurrently, through wrappers that stop a cancelled run at its next call."""

from __future__ import annotations

import inspect
import itertools
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend, Completion, HoleSampler, KVCache, StepModel
from qrun.backends.prefix_cache import PrefixCache
from qrun.errors import QrunError, QueueFull, RunCancelled
from qrun.runtime.constraints import ConstraintCompiler
from qrun.runtime.engines import Engines, choose_engines
from qrun.runtime.executor import Run
from qrun.runtime.request import RunRequest
from qrun.runtime.result import Result
from qrun.runtime.scheduler import ForwardScheduler, ScheduledModel

DEFAULT_MAX_RUNNING = 8
"""Runs of the shared admission (`Query.run`, `arun`, `astream`) that advance together; more
wait their turn: 8 rows keep a CPU forward busy, and a server sets its own (--max-running)."""

Outcome = Result | QrunError
"""What one run of a batch (`Runner.map`) ends with: its result, or the error that ended it."""


@dataclass(eq=False)
class Ticket:
    """One admitted run: its place in the batch (`order`: rows go in this order), its runner,
    its outcome (`future`), the flag its run checks at every forward, and `forwarded`, set once
    its first forward has returned (or the run has ended)."""

    request: RunRequest
    order: int
    runner: Runner  # held until the run ends, whoever else lets it go
    future: Future[Result] = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)
    forwarded: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Take the run back: a queued one never starts, a running one stops at its next
        forward."""
        self.cancelled.set()
        self.future.cancel()


class Runner:
    """The runs of one loaded backend (see the module). Made by `Runner.of`."""

    _made: weakref.WeakValueDictionary[Backend, Runner] = weakref.WeakValueDictionary()
    _made_lock = threading.Lock()

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.constraints = ConstraintCompiler(backend)
        # Nothing it owns points back at it (the listeners are told through a closure over
        # their list, admissions hold it weakly): a runner nobody holds goes at once, with its
        # model, instead of waiting for the cycle collector.
        listeners: list[Callable[[int], None]] = []

        def batched(rows: int) -> None:
            for listener in list(listeners):
                listener(rows)

        self.batch_listeners = listeners
        self.forwards: ForwardScheduler | None = None
        model = backend.step_model()
        if model is not None and not backend.capabilities.batches_itself:
            self.forwards = ForwardScheduler(model, backend.tree_scorer(),
                                             backend.batch_forward(), backend.tree_batch(),
                                             on_batch=batched)
        self._orders = itertools.count()
        self.shared = Admission(self, DEFAULT_MAX_RUNNING, sys.maxsize)

    @classmethod
    def of(cls, backend: Backend) -> Runner:
        """The runner of `backend`: the same one for as long as anything holds it (a Query
        that ran on the backend, a server), so its compiled constraints and its batches are
        shared by all of them."""
        with cls._made_lock:
            runner = cls._made.get(backend)
            if runner is None:
                runner = cls._made[backend] = cls(backend)
            return runner

    def admission(self, max_running: int, max_queue: int) -> Admission:
        """Admission of its own for a group of runs (a server's requests, a batch), whose
        forwards still meet every other run's in the one scheduler."""
        return Admission(self, max_running, max_queue)

    def submit(self, request: RunRequest) -> Ticket:
        """Start `request` in a thread of its own through the shared admission (queued while
        DEFAULT_MAX_RUNNING runs go): `Query.arun` and `astream`."""
        return self.shared.submit(request)

    def run(self, request: RunRequest) -> Result:
        """Run `request` to its end: in the caller's thread when the shared admission has a
        free slot (a plain `Query.run` gains no thread hop), else in its turn.

        Raises:
            what the run raises (QrunError for a user's error).
        """
        ticket = self.shared.admit_here(request)
        if ticket is None:
            ticket = self.shared.submit(request)
            try:
                return ticket.future.result()
            except BaseException:  # Ctrl-C while waiting: the run is not wanted any more
                ticket.cancel()
                raise
        try:
            return self.execute(ticket)
        finally:
            self.shared.finished(ticket)

    def check(self, request: RunRequest) -> None:
        """What `run` checks before any model work (host calls, constraints, the known values
        against their holes), without running: on a tokenizer alone it gives the same errors
        before the weights are loaded.

        Raises:
            QrunError: what the run would raise before its first forward.
        """
        self._run(request, choose_engines(self.backend)).check()

    def map(self, requests: Sequence[RunRequest | QrunError], max_running: int,
            on_result: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Run every request, up to `max_running` at a time sharing each forward; outcomes in
        request order, `on_result(i, outcome)` told each as it comes (from the run's thread).
        An error given in a request's place is its outcome; a run that fails puts its error
        in its place and the others complete.

        The first run starts alone: its first forward fills the prefix cache with the
        template's leading text, which the others then reuse instead of encoding it again in
        the batch.
        """
        if max_running == 1:
            return self._map_here(requests, on_result)
        outcomes: list[Outcome | None] = [None] * len(requests)
        done = threading.Semaphore(0)

        def record(index: int, outcome: Outcome) -> None:
            outcomes[index] = outcome
            if on_result is not None:
                on_result(index, outcome)
            done.release()

        def recorder(index: int) -> Callable[[Future[Result]], None]:
            def finished(future: Future[Result]) -> None:
                error = future.exception()
                if error is None:
                    record(index, future.result())
                elif isinstance(error, QrunError):
                    record(index, error)
                else:  # a bug: reported in this run's place, the others kept
                    record(index, QrunError(f"internal error: {type(error).__name__}: "
                                            f"{error}"))
            return finished

        admission = self.admission(max_running, sys.maxsize)
        tickets: list[Ticket] = []
        try:
            for index, request in enumerate(requests):
                if isinstance(request, QrunError):
                    record(index, request)
                    continue
                ticket = admission.submit(request)
                tickets.append(ticket)
                ticket.future.add_done_callback(recorder(index))
                if len(tickets) == 1:
                    ticket.forwarded.wait()  # the lead run alone, until its first forward
            for _ in requests:
                done.acquire()
        except BaseException:  # Ctrl-C: the runs not ended are not wanted any more
            admission.cancel_all()
            raise
        assert all(o is not None for o in outcomes), "every run records a result or an error"
        return [o for o in outcomes if o is not None]

    def _map_here(self, requests: Sequence[RunRequest | QrunError],
                  on_result: Callable[[int, Outcome], None] | None) -> list[Outcome]:
        """`map` one run at a time, each in the caller's thread (Runner.run)."""
        outcomes: list[Outcome] = []
        for index, request in enumerate(requests):
            outcome: Outcome
            try:
                outcome = request if isinstance(request, QrunError) else self.run(request)
            except QrunError as exc:
                outcome = exc
            outcomes.append(outcome)
            if on_result is not None:
                on_result(index, outcome)
        return outcomes

    def execute(self, ticket: Ticket) -> Result:
        """Run an admitted ticket's request in the calling thread."""
        try:
            return self._run(ticket.request, self._engines(ticket)).execute()
        finally:
            ticket.forwarded.set()

    def watch_batches(self, listener: Callable[[int], None]) -> Callable[[], None]:
        """Tell `listener` the rows of each batched forward (a server's metrics) while it
        lives (a bound method is held weakly, so a server that is never closed does not stay
        alive through its runner); returns what stops it."""
        told: Callable[[int], None] = listener
        if inspect.ismethod(listener):
            method = weakref.WeakMethod(listener)

            def told(rows: int) -> None:
                alive = method()
                if alive is not None:
                    alive(rows)

        self.batch_listeners.append(told)
        return lambda: self.batch_listeners.remove(told) if told in self.batch_listeners \
            else None

    def new_order(self) -> int:
        return next(self._orders)

    def _run(self, request: RunRequest, engines: Engines) -> Run:
        """The one place a run is built."""
        return Run(request, self.backend, self.constraints, engines)

    def _engines(self, ticket: Ticket) -> Engines:
        if self.forwards is None:
            own = self.backend.step_model()
            sampler = self.backend.hole_sampler() if own is None else None
            return choose_engines(
                self.backend, _CheckedModel(own, ticket) if own is not None else None,
                sampler=_CheckedSampler(sampler, ticket) if sampler is not None else None)
        model = _CancellableModel(self.forwards, ticket.order, ticket)
        tree = model if self.forwards.tree_scorer is not None else None
        return choose_engines(self.backend, model, tree)


class Admission:
    """Runs admitted first come, first served to a runner: up to `max_running` at a time
    (each in a worker thread of its own, counted by the runner's scheduler from before it
    starts until it ends), at most `max_queue` waiting."""

    def __init__(self, runner: Runner, max_running: int, max_queue: int) -> None:
        # Weakly (the runner holds its shared admission); each admitted ticket holds it
        # until its run ends.
        self._runner = weakref.ref(runner)
        self.max_running = max_running
        self.max_queue = max_queue
        self.lock = threading.Lock()  # guards queue, running, refusing
        self.queue: deque[Ticket] = deque()
        self.running: set[Ticket] = set()
        self.refusing = False  # set by cancel_all: a submit raises RunCancelled
        self.ended = threading.Condition(self.lock)  # notified when a run ends

    def submit(self, request: RunRequest) -> Ticket:
        """Admit a run: it starts now, in a thread of its own, if a slot is free, else it
        waits its turn.

        Raises:
            QueueFull: no slot is free and the queue is full.
            RunCancelled: the admission was cancelled (a server's drain ended).
        """
        with self.lock:
            ticket = self._ticket(request)
            self._prune()
            if len(self.running) < self.max_running:
                self._start(ticket)
            elif len(self.queue) < self.max_queue:
                self.queue.append(ticket)
            else:
                raise QueueFull(f"{len(self.running)} runs are running and {len(self.queue)} "
                                "wait: try again later")
            return ticket

    def admit_here(self, request: RunRequest) -> Ticket | None:
        """A ticket for a run in the caller's own thread, counted as running, when a slot is
        free and nothing waits; else None. The caller runs it, then calls `finished`."""
        with self.lock:
            if len(self.running) >= self.max_running or self.queue:
                return None
            ticket = self._ticket(request)
            self._count_in(ticket)
            ticket.future.set_running_or_notify_cancel()
            return ticket

    @property
    def runner(self) -> Runner:
        runner = self._runner()
        assert runner is not None, "an admission is used by whoever holds its runner"
        return runner

    def finished(self, ticket: Ticket) -> None:
        """`ticket`'s run has ended: its slot goes to the next queued run."""
        forwards = ticket.runner.forwards
        if forwards is not None:
            forwards.leave()
        with self.lock:
            self.running.discard(ticket)
            while self.queue:
                queued = self.queue.popleft()
                if not queued.future.cancelled():
                    self._start(queued)
                    break
            self.ended.notify_all()

    @property
    def queued(self) -> int:
        """Runs waiting for a slot (not those taken back while they waited)."""
        with self.lock:
            self._prune()
            return len(self.queue)

    @property
    def active(self) -> int:
        return len(self.running)

    @property
    def idle(self) -> bool:
        """No run is running or waiting."""
        with self.lock:
            self._prune()
            return not self.running and not self.queue

    def cancel_all(self) -> None:
        """Cancel every queued and running run (a running one ends at its next forward), and
        refuse the runs submitted after (RunCancelled): the end of a server's drain
        (qrun/serve/server.py), where a request of a batch would otherwise submit its next
        line."""
        with self.lock:
            self.refusing = True
            for ticket in [*self.queue, *self.running]:
                ticket.cancel()
            self.queue.clear()

    def close(self, wait_s: float = 5.0) -> None:
        """Cancel every queued and running run and wait up to `wait_s` for the running ones
        to end."""
        self.cancel_all()
        with self.lock:
            self.ended.wait_for(lambda: not self.running, timeout=wait_s)

    def _prune(self) -> None:
        """Drop the queued runs taken back (lock held): a request that timed out or whose
        client left while it waited gives its place back at once (issue #38: they held it
        until a slot freed, and a full queue of them refused every new request)."""
        if any(t.future.cancelled() for t in self.queue):
            self.queue = deque(t for t in self.queue if not t.future.cancelled())

    def _ticket(self, request: RunRequest) -> Ticket:
        if self.refusing:
            raise RunCancelled("the server is shutting down: it takes no more runs")
        runner = self.runner
        return Ticket(request, runner.new_order(), runner)

    def _count_in(self, ticket: Ticket) -> None:
        """Count `ticket` as running (lock held): in the scheduler before its thread can
        submit a forward, so no batch runs without it."""
        self.running.add(ticket)
        forwards = ticket.runner.forwards
        if forwards is not None:
            forwards.enter()

    def _start(self, ticket: Ticket) -> None:
        """Start `ticket`'s run in its own thread (lock held)."""
        self._count_in(ticket)
        threading.Thread(target=self._work, args=(ticket,), name=f"qrun-run-{ticket.order}",
                         daemon=True).start()

    def _work(self, ticket: Ticket) -> None:
        try:
            if ticket.future.set_running_or_notify_cancel():
                try:
                    ticket.future.set_result(ticket.runner.execute(ticket))
                except BaseException as exc:  # handed to whoever waits on the future
                    ticket.future.set_exception(exc)
        finally:
            self.finished(ticket)


class _CancellableModel(ScheduledModel):
    """The scheduled model as one admitted run sees it: a cancelled run's next forward raises
    RunCancelled instead of joining the batch. Its second forward tells the ticket
    (`forwarded`): the first is done and its prefix is in the prefix cache by then."""

    def __init__(self, scheduler: ForwardScheduler, order: int | tuple[int, ...],
                 ticket: Ticket) -> None:
        super().__init__(scheduler, order)
        self._ticket = ticket
        self._path = (order,) if isinstance(order, int) else order
        self._calls = 0

    def branch(self, index: int) -> ScheduledModel:
        return _CancellableModel(self.scheduler, (*self._path, index), self._ticket)

    def forward(self, token_ids: Sequence[int], cache: KVCache,
                logits_for: int = 1) -> npt.NDArray[np.float32]:
        if self._ticket.cancelled.is_set():
            raise RunCancelled
        self._calls += 1
        if self._calls == 2:
            self._ticket.forwarded.set()
        return super().forward(token_ids, cache, logits_for)

    def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int],
                     cache: KVCache) -> tuple[npt.NDArray[np.float32], KVCache]:
        if self._ticket.cancelled.is_set():
            raise RunCancelled
        return super().forward_tree(token_ids, parents, cache)

    def forward_step(self, rows: Sequence[tuple[Sequence[int], KVCache]],
                     trees: Sequence[tuple[Sequence[int], Sequence[int], KVCache]]
                     ) -> tuple[list[npt.NDArray[np.float32]],
                                list[tuple[npt.NDArray[np.float32], KVCache]]]:
        # forward_rows and forward_trees come here too (a particle step's forwards)
        if self._ticket.cancelled.is_set():
            raise RunCancelled
        return super().forward_step(rows, trees)


class _CheckedModel:
    """The step model of a backend that batches itself (vLLM), as one admitted run sees it:
    a cancelled run's next forward raises RunCancelled (its engine schedules the forwards,
    so no ForwardScheduler sees them)."""

    def __init__(self, model: StepModel, ticket: Ticket) -> None:
        self.model = model
        self.ticket = ticket

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.model.prefix_cache

    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    def forward(self, token_ids: Sequence[int], cache: KVCache,
                logits_for: int = 1) -> npt.NDArray[np.float32]:
        if self.ticket.cancelled.is_set():
            raise RunCancelled
        logits = self.model.forward(token_ids, cache, logits_for)
        self.ticket.forwarded.set()
        return logits


class _CheckedSampler:
    """A backend's hole sampler (a vLLM server), as one admitted run sees it: a cancelled
    run's next hole raises RunCancelled instead of asking the server."""

    def __init__(self, sampler: HoleSampler, ticket: Ticket) -> None:
        self.sampler = sampler
        self.ticket = ticket

    def complete(self, prompt: Sequence[int], max_tokens: int, *, temperature: float,
                 top_p: float, top_k: int, seed: int, stop: Sequence[str] = (),
                 regex: str | None = None, grammar: str | None = None,
                 stop_token_ids: Sequence[int] = (),
                 extra: Mapping[str, object] | None = None) -> Completion:
        if self.ticket.cancelled.is_set():
            raise RunCancelled
        completion = self.sampler.complete(
            prompt, max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
            stop=stop, regex=regex, grammar=grammar, stop_token_ids=stop_token_ids,
            extra=extra)
        self.ticket.forwarded.set()
        return completion

    def reads_llguidance(self) -> bool:
        return self.sampler.reads_llguidance()
