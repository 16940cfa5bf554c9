"""Batched runs: up to B runs of one program advance together, each in its own thread with its
own session, constraint state and holes; their forwards meet in a scheduler that feeds them to
the model as one batch (per-row cache lengths, padding hidden by an attention mask)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from qrun.backends.base import Backend, KVCache
from qrun.errors import QrunError
from qrun.lang.ir import Program
from qrun.runtime.constraints import ConstraintCompiler
from qrun.runtime.executor import RunOptions, execute
from qrun.runtime.prefix_cache import PrefixCache
from qrun.runtime.result import Result
from qrun.runtime.vocab import Vocabulary

Outcome = Result | QrunError


@dataclass(eq=False)
class _Request:
    """A forward waiting for the next batch (kind "forward"), or a call that runs alone."""

    kind: str
    args: tuple[Any, ...]
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class ForwardScheduler:
    """Collects forwards from worker threads and runs them together once every active worker
    is waiting on one: workers doing CPU work (masks, sampling) are never left behind."""

    backend: Backend
    active: int = 0
    batches: int = 0
    pending: list[_Request] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    submitted: int = 0

    def submit(self, kind: str, *args: Any) -> Any:
        request = _Request(kind, args)
        with self.cond:
            self.submitted += 1
            self.pending.append(request)
            self.cond.notify_all()
            while not request.done:
                self.cond.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def enter(self) -> None:
        with self.cond:
            self.active += 1

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def serve(self, finished: Callable[[], bool]) -> None:
        """Run batches until `finished()` and no request is left."""
        while True:
            with self.cond:
                while not (self.pending and len(self.pending) >= self.active) and not (
                    finished() and not self.pending
                ):
                    self.cond.wait(timeout=0.5)
                if not self.pending:
                    return
                requests, self.pending = self.pending, []
            self._run(requests)
            with self.cond:
                for request in requests:
                    request.done = True
                self.cond.notify_all()

    def wait_for_submissions(self, count: int, alive: Callable[[], bool]) -> None:
        """Block until `count` requests were submitted in all, or `alive()` turns false."""
        with self.cond:
            while self.submitted < count and alive():
                self.cond.wait(timeout=0.05)

    def _run(self, requests: list[_Request]) -> None:
        forwards = [r for r in requests if r.kind == "forward"]
        if forwards:
            self.batches += 1
            try:
                items = [(r.args[0], r.args[1]) for r in forwards]
                keep = max(r.args[2] for r in forwards)
                outputs = self._forward_batch(items, keep)
                for request, logits in zip(forwards, outputs, strict=True):
                    request.result = logits[-request.args[2] :]
            except BaseException as exc:  # each waiting run gets the failure as its own
                for request in forwards:
                    request.error = exc
        for request in requests:
            if request.kind == "forward_tree":
                try:
                    request.result = self.backend.forward_tree(*request.args)  # type: ignore[attr-defined]
                except BaseException as exc:
                    request.error = exc

    def _forward_batch(
        self, items: list[tuple[Sequence[int], KVCache]], keep: int
    ) -> list[torch.Tensor]:
        if len(items) == 1:
            ids, cache = items[0]
            return [self.backend.forward(ids, cache, keep)]
        return list(self.backend.forward_batch(items, keep))  # type: ignore[attr-defined]


class BatchedBackend:
    """The backend as seen by one batched run: everything is the real backend's, except that
    forwards go through the scheduler."""

    def __init__(self, backend: Backend, scheduler: ForwardScheduler) -> None:
        self._backend = backend
        self._scheduler = scheduler
        self.name = backend.name
        self.device = backend.device
        self.dtype = backend.dtype
        self.load_s = backend.load_s
        self.prefix_cache: PrefixCache | None = backend.prefix_cache

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._backend.eos_token_ids

    @property
    def start_token_id(self) -> int:
        return self._backend.start_token_id

    @property
    def vocabulary(self) -> Vocabulary:
        return self._backend.vocabulary

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._backend.decode(token_ids)

    def chat_markers(self, role: str) -> tuple[str, str] | None:
        return self._backend.chat_markers(role)

    def new_cache(self) -> KVCache:
        return self._backend.new_cache()

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, logits_for: int = 1
    ) -> torch.Tensor:
        result: torch.Tensor = self._scheduler.submit("forward", list(token_ids), cache,
                                                      logits_for)
        return result

    def forward_tree(
        self, token_ids: Sequence[int], parents: Sequence[int], cache: KVCache
    ) -> tuple[torch.Tensor, KVCache]:
        result: tuple[torch.Tensor, KVCache] = self._scheduler.submit(
            "forward_tree", token_ids, parents, cache)
        return result

    def keep_path(self, tree: KVCache, length: int, path: Sequence[int]) -> KVCache:
        return self._backend.keep_path(tree, length, path)  # type: ignore[attr-defined, no-any-return]


class CountingBackend:
    """A backend that batches itself (vLLM in-process or a server), as seen by one batched
    run: the backend itself, with its model calls counted in the scheduler (the lead run's
    first call must be done before the others start, so they find its prefix cached)."""

    _COUNTED = frozenset({"forward", "complete", "score_continuations"})

    def __init__(self, backend: Backend, scheduler: ForwardScheduler) -> None:
        self._backend = backend
        self._scheduler = scheduler

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        if name not in self._COUNTED:
            return value
        scheduler = self._scheduler

        def counted(*args: Any, **kwargs: Any) -> Any:
            with scheduler.cond:
                scheduler.submitted += 1
                scheduler.cond.notify_all()
            return value(*args, **kwargs)

        return counted


def run_batched(
    program: Program,
    backend: Backend,
    inputs: Sequence[Mapping[str, Any]],
    options: RunOptions,
    constraints: ConstraintCompiler,
    batch_size: int,
    on_result: Callable[[int, Outcome], None] | None = None,
) -> list[Outcome]:
    """Run `program` once per input, up to `batch_size` runs at a time sharing each forward.

    The first run starts alone: its first forward fills the prefix cache with the template's
    leading text, which the others then reuse instead of encoding it again in the batch.
    A failing run puts its error in its place; the others complete.
    """
    outcomes: list[Outcome | None] = [None] * len(inputs)
    scheduler = ForwardScheduler(backend)
    # A backend with its own scheduler (vLLM) batches whatever is in flight: runs call it
    # directly, and the scheduler here only counts their forwards for the lead-run rule.
    own = bool(getattr(backend, "batches_itself", False))
    proxy: Any = CountingBackend(backend, scheduler) if own else BatchedBackend(backend, scheduler)
    next_index = [0]
    lock = threading.Lock()
    finished = threading.Event()

    def take() -> int | None:
        with lock:
            if next_index[0] >= len(inputs):
                return None
            next_index[0] += 1
            return next_index[0] - 1

    def work(first: int | None) -> None:
        index = first if first is not None else take()
        while index is not None:
            outcome: Outcome
            try:
                outcome = execute(program, proxy, inputs[index], options, None, constraints)
            except QrunError as exc:
                outcome = exc
            except Exception as exc:  # a bug: report it in this run's place, keep the others
                outcome = QrunError(f"internal error: {type(exc).__name__}: {exc}")
            outcomes[index] = outcome
            if on_result is not None:
                on_result(index, outcome)
            index = take()

    def worker(first: int | None) -> None:
        try:
            work(first)
        finally:
            scheduler.leave()

    threads: list[threading.Thread] = []

    def start(first: int | None) -> None:
        scheduler.enter()
        thread = threading.Thread(target=worker, args=(first,), daemon=True)
        threads.append(thread)
        thread.start()

    def launcher() -> None:
        first = take()
        if first is None:
            finished.set()
            return
        start(first)
        # Let the others in once the lead run has done its first forward and put it in the
        # prefix cache, i.e. when it asks for its second forward (or has ended).
        scheduler.wait_for_submissions(2, threads[0].is_alive)
        for _ in range(min(batch_size, len(inputs)) - 1):
            start(None)
        for thread in threads:
            thread.join()
        finished.set()

    launch = threading.Thread(target=launcher, daemon=True)
    launch.start()
    if not own:
        scheduler.serve(finished.is_set)
    launch.join()
    done = [o for o in outcomes if o is not None]
    assert len(done) == len(outcomes), "every run records a result or an error"
    return done
