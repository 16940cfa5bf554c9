"""Long-lived batching of runs, for `qrun serve` and `Query.arun` (docs/serve.md §3): runs
admitted first come, first served, up to `max_running` at a time with at most `max_queue`
waiting; each in a worker thread of its own, its forwards meeting those of every other running
run in one ForwardScheduler (qrun/runtime/scheduler.py) whose serve loop owns the model for the
scheduler's life. A run joins
the batch at its first forward and leaves it when it ends; nothing waits for a batch to fill.
A backend that batches itself (vLLM) gets the runs' calls concurrently, as run_batched does
(qrun/runtime/batch.py), through wrappers that stop a cancelled run at its next call."""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend, Completion, HoleSampler, KVCache, StepModel
from qrun.backends.prefix_cache import PrefixCache
from qrun.runtime.engines import Engines, choose_engines
from qrun.runtime.scheduler import ForwardScheduler, ScheduledModel


class QueueFull(Exception):
    """Every run slot is taken and the queue holds `max_queue` runs already."""


class RunCancelled(Exception):
    """The run's request timed out or went away: the run ends at its next forward, which
    frees its KV cache (the session closes as the exception unwinds it)."""


Work = Callable[[Engines], Any]
"""What an admitted request does with the engines of its run: build the run and execute it."""


@dataclass(eq=False)
class Ticket:
    """One admitted request: its place in the batch (`order`), its outcome (`future`), and
    the flag its run checks at every forward."""

    work: Work
    order: int
    future: Future[Any] = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Take the request back: a queued one never starts, a running one stops at its
        next forward."""
        self.cancelled.set()
        self.future.cancel()


class _CancellableModel(ScheduledModel):
    """The scheduled model as one server run sees it: a cancelled run's next forward raises
    RunCancelled instead of joining the batch."""

    def __init__(self, scheduler: ForwardScheduler, order: int | tuple[int, ...],
                 cancelled: threading.Event) -> None:
        super().__init__(scheduler, order)
        self._cancelled = cancelled
        self._path = (order,) if isinstance(order, int) else order

    def branch(self, index: int) -> ScheduledModel:
        return _CancellableModel(self.scheduler, (*self._path, index), self._cancelled)

    def forward(self, token_ids: Sequence[int], cache: KVCache,
                logits_for: int = 1) -> npt.NDArray[np.float32]:
        if self._cancelled.is_set():
            raise RunCancelled
        return super().forward(token_ids, cache, logits_for)

    def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int],
                     cache: KVCache) -> tuple[npt.NDArray[np.float32], KVCache]:
        if self._cancelled.is_set():
            raise RunCancelled
        return super().forward_tree(token_ids, parents, cache)


class _CheckedModel:
    """The step model of a backend that batches itself (vLLM), as one server run sees it:
    a cancelled run's next forward raises RunCancelled (its engine schedules the forwards,
    so no ForwardScheduler sees them)."""

    def __init__(self, model: StepModel, cancelled: threading.Event) -> None:
        self.model = model
        self.cancelled = cancelled

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.model.prefix_cache

    def new_cache(self) -> KVCache:
        return self.model.new_cache()

    def forward(self, token_ids: Sequence[int], cache: KVCache,
                logits_for: int = 1) -> npt.NDArray[np.float32]:
        if self.cancelled.is_set():
            raise RunCancelled
        return self.model.forward(token_ids, cache, logits_for)


class _CheckedSampler:
    """A backend's hole sampler (a vLLM server), as one server run sees it: a cancelled
    run's next hole raises RunCancelled instead of asking the server."""

    def __init__(self, sampler: HoleSampler, cancelled: threading.Event) -> None:
        self.sampler = sampler
        self.cancelled = cancelled

    def complete(self, prompt: Sequence[int], max_tokens: int, *, temperature: float,
                 top_p: float, top_k: int, seed: int, stop: Sequence[str] = (),
                 regex: str | None = None, grammar: str | None = None,
                 stop_token_ids: Sequence[int] = ()) -> Completion:
        if self.cancelled.is_set():
            raise RunCancelled
        return self.sampler.complete(prompt, max_tokens, temperature=temperature, top_p=top_p,
                                     top_k=top_k, seed=seed, stop=stop, regex=regex,
                                     grammar=grammar, stop_token_ids=stop_token_ids)

    def reads_llguidance(self) -> bool:
        return self.sampler.reads_llguidance()


class RunScheduler:
    """Admission and the worker threads of a server's runs on one backend. `start()` starts
    the forward loop's thread; `close()` takes back what is queued, cancels what runs and
    ends the loop."""

    def __init__(self, backend: Backend, max_running: int, max_queue: int,
                 on_batch: Callable[[int], None] | None = None) -> None:
        self.backend = backend
        self.max_running = max_running
        self.max_queue = max_queue
        self.forwards: ForwardScheduler | None = None
        model = backend.step_model()
        if model is not None and not backend.capabilities.batches_itself:
            self.forwards = ForwardScheduler(model, backend.tree_scorer(),
                                             backend.batch_forward(), on_batch=on_batch)
        self.lock = threading.Lock()  # guards queue, running, orders
        self.queue: deque[Ticket] = deque()
        self.running: set[Ticket] = set()
        self.orders = 0
        self.refusing = False  # set by cancel_all: a submit raises RunCancelled
        self.stopped = threading.Event()
        self.ended = threading.Condition(self.lock)  # notified when a run ends
        self.loop: threading.Thread | None = None

    @classmethod
    def shared(cls, backend: Backend, max_running: int = 8) -> RunScheduler:
        """The scheduler that `Query.arun` calls on `backend` share (made, and its loop
        started, on first use; its queue unbounded; kept, with the backend, for the process's
        life): the runs of an application's coroutines are batched together without a
        server."""
        with _SHARED_LOCK:
            scheduler = _SHARED.get(backend)
            if scheduler is None:
                scheduler = _SHARED[backend] = cls(backend, max_running, sys.maxsize)
                scheduler.start()
            return scheduler

    def start(self) -> None:
        if self.forwards is not None and self.loop is None:
            self.loop = threading.Thread(target=self.forwards.serve, args=(self.stopped.is_set,),
                                         name="qrun-forwards", daemon=True)
            self.loop.start()

    def submit(self, work: Work) -> Ticket:
        """Admit a request: its run starts now if a slot is free, else it waits its turn.

        Raises:
            QueueFull: no slot is free and the queue is full.
        """
        with self.lock:
            if self.stopped.is_set():
                raise QueueFull("the server is shutting down")
            if self.refusing:
                raise RunCancelled("the server is shutting down: it takes no more runs")
            self.start()  # an ASGI server that runs no lifespan never called it
            ticket = Ticket(work, self.orders)
            self.orders += 1
            if len(self.running) < self.max_running:
                self._start(ticket)
            elif len(self.queue) < self.max_queue:
                self.queue.append(ticket)
            else:
                raise QueueFull(f"{len(self.running)} runs are running and {len(self.queue)} "
                                "wait: try again later")
            return ticket

    @property
    def queued(self) -> int:
        return len(self.queue)

    @property
    def active(self) -> int:
        return len(self.running)

    @property
    def idle(self) -> bool:
        """No run is running or waiting."""
        with self.lock:
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
        """Cancel every queued and running run, wait up to `wait_s` for the running ones to
        end, then end the forward loop."""
        self.cancel_all()
        with self.lock:
            self.ended.wait_for(lambda: not self.running, timeout=wait_s)
            self.stopped.set()
        if self.loop is not None:
            self.loop.join(timeout=wait_s)

    def _start(self, ticket: Ticket) -> None:
        """Start `ticket`'s run in its own thread (lock held): counted by the forward loop
        before the thread can submit a forward, so no batch runs without it."""
        self.running.add(ticket)
        if self.forwards is not None:
            self.forwards.enter()
        threading.Thread(target=self._work, args=(ticket,), name=f"qrun-run-{ticket.order}",
                         daemon=True).start()

    def _work(self, ticket: Ticket) -> None:
        try:
            if ticket.future.set_running_or_notify_cancel():
                try:
                    ticket.future.set_result(ticket.work(self._engines(ticket)))
                except BaseException as exc:  # handed to the request's handler
                    ticket.future.set_exception(exc)
        finally:
            if self.forwards is not None:
                self.forwards.leave()
            with self.lock:
                self.running.discard(ticket)
                while self.queue and not self.stopped.is_set():
                    queued = self.queue.popleft()
                    if not queued.future.cancelled():
                        self._start(queued)
                        break
                self.ended.notify_all()

    def _engines(self, ticket: Ticket) -> Engines:
        if self.forwards is None:
            own = self.backend.step_model()
            sampler = self.backend.hole_sampler() if own is None else None
            return choose_engines(
                self.backend, _CheckedModel(own, ticket.cancelled) if own is not None else None,
                sampler=(_CheckedSampler(sampler, ticket.cancelled) if sampler is not None
                         else None))
        model = _CancellableModel(self.forwards, ticket.order, ticket.cancelled)
        tree = model if self.forwards.tree_scorer is not None else None
        return choose_engines(self.backend, model, tree)


_SHARED: dict[Backend, RunScheduler] = {}
_SHARED_LOCK = threading.Lock()
