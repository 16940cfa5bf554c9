"""The forward scheduler of a model's runs (qrun/runtime/runner.py, one per loaded backend) and
of their branches (runtime/branches.py): worker threads, each with its own session, submit their
forwards, which run together as one batch (per-row cache lengths, padding hidden by an attention
mask) once every active worker is waiting on one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import BatchForward, KVCache, StepModel, TreeBatch, TreeScorer
from qrun.backends.prefix_cache import PrefixCache


@dataclass(eq=False)
class _Request:
    """A forward waiting for the next batch, or a tree forward (batched with the other trees
    where the backend can: TreeBatch)."""

    tree: bool
    # the run's index (then a branch's index in each fork, runtime/branches.py): a batch's
    # rows are put in this order
    order: tuple[int, ...]
    args: tuple[Any, ...]
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class ForwardScheduler:
    """Collects forwards from worker threads and runs them together once every active worker
    is waiting on one: workers doing CPU work (masks, sampling) are never left behind. A
    worker counts from `enter()` to `leave()`."""

    model: StepModel
    tree_scorer: TreeScorer | None
    batcher: BatchForward | None
    tree_batch: TreeBatch | None = None
    active: int = 0
    pending: list[_Request] = field(default_factory=list)
    # The workers whose requests are pending: a batch runs once they are all the active ones
    # (a particle step queues many requests from one worker; counting requests ran batches
    # while other workers still computed, beside the forward's threads).
    waiting: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    # Told each batch's rows (the runner's listeners: a server's metrics,
    # qrun/serve/service.py).
    on_batch: Callable[[int], None] | None = None
    running: bool = False  # a batch is being run (_lead)
    thread: threading.Thread | None = None  # the forward thread, while it runs

    def submit(self, tree: bool, order: tuple[int, ...], *args: Any) -> Any:
        """Wait for this forward's row of a batch. A worker alone runs its forward in its own
        thread (a plain `Query.run` pays no hop); batches of several rows run in the
        scheduler's forward thread."""
        return self._wait([_Request(tree, order, args)])[0]

    def submit_step(self, order: tuple[int, ...],
                    rows: Sequence[tuple[Sequence[int], KVCache]],
                    trees: Sequence[tuple[Sequence[int], Sequence[int], KVCache]] = ()
                    ) -> tuple[list[Any], list[Any]]:
        """Several forwards of one worker as rows of the next batch, and several tree
        forwards in the same batch, in order after `order` (a particle step: its rows, and the
        trees of the paths it finishes, runtime/particles.py): each row's logits after its
        last token, and each tree's result as TreeScorer.forward_tree gives it."""
        results = self._wait(
            [_Request(False, (*order, i), (list(ids), cache, 1))
             for i, (ids, cache) in enumerate(rows)]
            + [_Request(True, (*order, len(rows) + i), (list(ids), list(parents), cache))
               for i, (ids, parents, cache) in enumerate(trees)])
        return results[:len(rows)], results[len(rows):]

    def _wait(self, requests: list[_Request]) -> list[Any]:
        """Queue `requests` (one worker's) and wait until they have run: at once in this
        thread when nothing else is pending or running and no other worker is active."""
        if not requests:
            return []
        with self.cond:
            alone = self.active <= 1 and not self.pending and not self.running
            self.pending.extend(requests)
            self.waiting += 1
            if alone:
                self._lead()
            else:
                self._wake()
                while not all(request.done for request in requests):
                    self.cond.wait()
        for request in requests:
            if request.error is not None:
                raise request.error
        return [request.result for request in requests]

    def enter(self) -> None:
        with self.cond:
            self.active += 1

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            if self.pending:
                self._wake()  # the workers left waiting may now be a whole batch
            elif self.active == 0:
                self.cond.notify_all()  # the forward thread, if any, ends

    def _wake(self) -> None:
        """Tell the forward thread of new work (lock held), starting it if it is not running:
        one thread runs the batches while runs go, so torch's OpenMP team lives in one thread
        (qrun/backends/passing_thread.py says what more teams cost). Measured on bench.serve
        --threads 2 (2-core AVX2, SmolLM2, 32 requests): batches led by the runs' own threads
        served 2.0-2.1 requests/s at 4 clients and 3.5-3.7 at 16, against 2.6-2.7 and 4.7-4.8
        here."""
        self.cond.notify_all()
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="qrun-forwards",
                                           daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        """The forward thread: run each batch once every active worker waits on one; end
        when no worker is left (the next batch of several rows starts it again), so that no
        thread that ran the model outlives its runs (one left waiting at the interpreter's
        exit aborted it: "terminate called without an active exception")."""
        with self.cond:
            while True:
                if not self.running and self.pending and self.waiting >= self.active:
                    self._lead()
                elif not self.pending and self.active == 0:
                    self.thread = None
                    return
                else:
                    self.cond.wait()

    def _lead(self) -> None:
        """Run the pending forwards as one batch in the calling thread (the lock is held on
        entry and on return, not while the model runs); nothing keeps a finished batch's
        requests (they hold their runs' KV caches)."""
        requests, self.pending = self.pending, []
        self.waiting = 0
        self.running = True
        self.cond.release()
        try:
            self._run(requests)
        finally:
            self.cond.acquire()
            self.running = False
            for request in requests:
                request.done = True
            self.cond.notify_all()

    def _run(self, requests: list[_Request]) -> None:
        # Requests arrive in whatever order the worker threads got to them; the rows of a
        # batched forward go in run order, so the float rounding of every row (and with it
        # a greedy choice between near-equal logits) is the same from one call to the next.
        requests = sorted(requests, key=lambda r: r.order)
        forwards = [r for r in requests if not r.tree]
        if forwards:
            if self.on_batch is not None:
                self.on_batch(len(forwards))
            try:
                items = [(r.args[0], r.args[1]) for r in forwards]
                keep = max(r.args[2] for r in forwards)
                outputs = self._forward_batch(items, keep)
                for request, logits in zip(forwards, outputs, strict=True):
                    request.result = logits[-request.args[2] :]
            except BaseException as exc:  # each waiting run gets the failure as its own
                for request in forwards:
                    request.error = exc
        trees = [r for r in requests if r.tree]
        if len(trees) > 1 and self.tree_batch is not None:
            results: Sequence[tuple[npt.NDArray[np.float32], KVCache]] | None
            try:
                results = self.tree_batch.forward_trees([r.args for r in trees])
            except Exception:  # each tree is then tried alone, below
                results = None
            if results is not None:
                for request, result in zip(trees, results, strict=True):
                    request.result = result
                return
        # One at a time: where trees are not batched, and where a batch of them failed, so
        # that one run's failing tree (the memory of its logits, a token the model lacks) is
        # that run's error and every other run gets its scores.
        for request in trees:
            try:
                assert self.tree_scorer is not None, "tree forwards come from ScheduledModel"
                request.result = self.tree_scorer.forward_tree(*request.args)
            except BaseException as exc:
                request.error = exc

    def _forward_batch(
        self, items: list[tuple[Sequence[int], KVCache]], keep: int
    ) -> list[npt.NDArray[np.float32]]:
        if len(items) == 1 or self.batcher is None:
            return [self.model.forward(ids, cache, keep) for ids, cache in items]
        return self.batcher.forward_batch(items, keep)


class ScheduledModel:
    """The backend's step model (and tree scorer) as one batched run sees it: forwards go
    through the scheduler, everything else is the model's own."""

    def __init__(self, scheduler: ForwardScheduler, order: int | tuple[int, ...]) -> None:
        self._scheduler = scheduler
        self._model = scheduler.model
        self._order = (order,) if isinstance(order, int) else order

    @property
    def scheduler(self) -> ForwardScheduler:
        return self._scheduler

    def branch(self, index: int) -> ScheduledModel:
        """The model as branch `index` of a fork in this run sees it (its rows after this
        run's, in branch order)."""
        return ScheduledModel(self._scheduler, (*self._order, index))

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self._model.prefix_cache

    def new_cache(self) -> KVCache:
        return self._model.new_cache()

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, logits_for: int = 1
    ) -> npt.NDArray[np.float32]:
        result: npt.NDArray[np.float32] = self._scheduler.submit(
            False, self._order, list(token_ids), cache, logits_for)
        return result

    def forward_rows(self, items: Sequence[tuple[Sequence[int], KVCache]]
                     ) -> list[npt.NDArray[np.float32]]:
        """Each item's tokens fed on top of its cache, as rows of one batch: per item, the
        logits after its last token, [1, V]."""
        return self.forward_step(items, [])[0]

    def forward_tree(
        self, token_ids: Sequence[int], parents: Sequence[int], cache: KVCache
    ) -> tuple[npt.NDArray[np.float32], KVCache]:
        result: tuple[npt.NDArray[np.float32], KVCache] = self._scheduler.submit(
            True, self._order, token_ids, parents, cache)
        return result

    def forward_trees(self, items: Sequence[tuple[Sequence[int], Sequence[int], KVCache]]
                      ) -> list[tuple[npt.NDArray[np.float32], KVCache]]:
        """Each item (token_ids, parents, cache) as forward_tree takes it, in one batch."""
        return self.forward_step([], items)[1]

    def forward_step(self, rows: Sequence[tuple[Sequence[int], KVCache]],
                     trees: Sequence[tuple[Sequence[int], Sequence[int], KVCache]]
                     ) -> tuple[list[npt.NDArray[np.float32]],
                                list[tuple[npt.NDArray[np.float32], KVCache]]]:
        """forward_rows' rows and forward_trees' trees in one batch."""
        return self._scheduler.submit_step(self._order, rows, trees)

    @contextmanager
    def aside(self) -> Iterator[None]:
        """This worker steps out of the batch for the block (a host function's call): the
        other runs' forwards go on without waiting for it (issue #38: a host function that
        slept held every other request of a server), and it counts again after."""
        self._scheduler.leave()
        try:
            yield
        finally:
            self._scheduler.enter()

    def keep_path(self, tree: KVCache, length: int, path: Sequence[int]) -> KVCache:
        assert self._scheduler.tree_scorer is not None
        return self._scheduler.tree_scorer.keep_path(tree, length, path)


def forward_rows(model: StepModel, batcher: BatchForward | None,
                 items: Sequence[tuple[Sequence[int], KVCache]]) -> list[npt.NDArray[np.float32]]:
    """Each item's tokens fed on top of its own cache, batched where the model can: through
    its run's scheduler (with the other runs' rows), else the backend's batch forward, else
    one forward each. Per item, the logits after its last token, [1, V]."""
    if isinstance(model, ScheduledModel):
        return model.forward_rows(items)
    if batcher is not None and len(items) > 1:
        return batcher.forward_batch(items, 1)
    return [model.forward(ids, cache, 1) for ids, cache in items]


def forward_trees(scorer: TreeScorer, items: Sequence[tuple[Sequence[int], Sequence[int], KVCache]]
                  ) -> list[tuple[npt.NDArray[np.float32], KVCache]]:
    """Each item's tree (token_ids, parents, cache) fed as forward_tree feeds it: through its
    run's scheduler in one batch (the backend's TreeBatch, where it has one) where `scorer` is
    a run's scheduled model, else one forward each."""
    if isinstance(scorer, ScheduledModel):
        return scorer.forward_trees(items)
    return [scorer.forward_tree(ids, parents, cache) for ids, parents, cache in items]


def forward_step(model: StepModel, batcher: BatchForward | None, scorer: TreeScorer | None,
                 rows: Sequence[tuple[Sequence[int], KVCache]],
                 trees: Sequence[tuple[Sequence[int], Sequence[int], KVCache]]
                 ) -> tuple[list[npt.NDArray[np.float32]],
                            list[tuple[npt.NDArray[np.float32], KVCache]]]:
    """forward_rows' `rows` and forward_trees' `trees` (on `scorer`): in one batch of the run's
    scheduler where `model` is a run's scheduled model (a particle step whose paths step and
    finish at once waits for one batch, not two, and the other runs with it), else one after
    the other."""
    if isinstance(model, ScheduledModel) and rows and trees:
        return model.forward_step(rows, trees)
    assert scorer is not None or not trees, "trees need a tree scorer"
    return (forward_rows(model, batcher, rows) if rows else [],
            forward_trees(scorer, trees) if scorer is not None and trees else [])
