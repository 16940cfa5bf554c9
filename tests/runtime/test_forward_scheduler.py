"""ForwardScheduler (qrun/runtime/scheduler.py), which batches the forwards of runs in threads
(qrun/runtime/runner.py): who runs a batch, and what it keeps once a batch is done."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from qrun.runtime.scheduler import ForwardScheduler
from tests.hang import alarm, wait_until


class Cache:
    """A stand-in KV cache: only its lifetime matters here."""


class Model:
    prefix_cache = None

    def new_cache(self) -> Cache:
        return Cache()

    def forward(self, token_ids: Sequence[int], cache: Cache,
                logits_for: int = 1) -> npt.NDArray[np.float32]:
        return np.zeros((logits_for, 4), dtype=np.float32)


def test_a_lone_forward_runs_in_its_own_thread_and_nothing_keeps_its_cache() -> None:
    # A served model idle between requests must not hold the last batch's KV (llama.cpp's
    # sequences, tests/serve/test_serve_llamacpp.py); and a run alone pays no thread hop.
    threads: list[threading.Thread] = []

    class Watched(Model):
        def forward(self, token_ids: Sequence[int], cache: Cache,
                    logits_for: int = 1) -> npt.NDArray[np.float32]:
            threads.append(threading.current_thread())
            return super().forward(token_ids, cache, logits_for)

    scheduler = ForwardScheduler(Watched(), None, None)
    cache = Cache()
    alive = weakref.ref(cache)
    scheduler.enter()
    logits = scheduler.submit(False, (0,), [1, 2], cache, 1)
    scheduler.leave()
    assert logits.shape == (1, 4)
    assert threads == [threading.current_thread()]
    del cache
    gc.collect()
    assert alive() is None and not scheduler.pending


def test_a_batch_of_several_rows_runs_once_in_the_forward_thread() -> None:
    # One long-lived thread runs the batches: torch's OpenMP team lives in one thread
    # (qrun/backends/passing_thread.py; the runs' own threads leading batches served 11-13 %
    # fewer requests/s on bench.serve --threads 2).
    rows: list[tuple[int, str]] = []

    class Batched(Model):
        def forward_batch(self, items: list[tuple[Sequence[int], Cache]],
                          keep: int) -> list[npt.NDArray[np.float32]]:
            rows.append((len(items), threading.current_thread().name))
            return [np.full((keep, 4), len(ids), dtype=np.float32) for ids, _ in items]

    model = Batched()
    scheduler = ForwardScheduler(model, None, model)
    results: dict[int, float] = {}

    def worker(order: int) -> None:
        try:
            logits = scheduler.submit(False, (order,), [0] * (order + 1), Cache(), 1)
            results[order] = float(logits[0, 0])
        finally:
            scheduler.leave()

    for _ in range(3):
        scheduler.enter()
    threads = [threading.Thread(target=worker, args=(order,)) for order in range(3)]
    with alarm(30):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert rows == [(3, "qrun-forwards")] and results == {0: 1.0, 1: 2.0, 2: 3.0}
    assert scheduler.active == 0 and not scheduler.running


def test_a_worker_that_leaves_lets_the_others_batch_without_it() -> None:
    # Two workers counted, one never submits: its leave completes the other's batch.
    scheduler = ForwardScheduler(Model(), None, None)
    scheduler.enter()
    scheduler.enter()
    done = threading.Event()

    def worker() -> None:
        scheduler.submit(False, (0,), [1], Cache(), 1)
        done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    wait_until(lambda: len(scheduler.pending) == 1)
    assert not done.is_set()
    scheduler.leave()
    with alarm(30):
        thread.join()
    assert done.is_set()


def test_a_step_of_several_rows_waits_for_the_other_workers() -> None:
    # A particle step queues several rows from one worker (submit_step): the batch waits for
    # every active worker, not for as many requests as there are workers (that ran the step's
    # rows alone, beside the other workers' CPU work: 43-45 batches for 16 runs of
    # bench/faithfulness.py's sentence-2400, 32-33 once counted by worker).
    rows: list[int] = []

    class Batched(Model):
        def forward_batch(self, items: list[tuple[Sequence[int], Cache]],
                          keep: int) -> list[npt.NDArray[np.float32]]:
            rows.append(len(items))
            return [np.zeros((keep, 4), dtype=np.float32) for _ in items]

    model = Batched()
    scheduler = ForwardScheduler(model, None, model)
    scheduler.enter()
    scheduler.enter()

    def stepping() -> None:
        try:
            scheduler.submit_step((0,), [([1], Cache()), ([2], Cache()), ([3], Cache())])
        finally:
            scheduler.leave()

    thread = threading.Thread(target=stepping, daemon=True)
    with alarm(30):
        thread.start()
        wait_until(lambda: len(scheduler.pending) == 3)
        threading.Event().wait(0.2)  # time enough for a batch that would not wait
        assert rows == []
        scheduler.submit(False, (1,), [4], Cache(), 1)
        scheduler.leave()
        thread.join()
    assert rows == [4]


def test_trees_run_as_one_batch_and_a_failing_tree_fails_only_its_own_run() -> None:
    # Trees of several runs go to the backend's TreeBatch together; when that batch fails,
    # each tree runs alone, so only the run whose tree fails gets the error.
    calls: list[int] = []

    class Trees(Model):
        def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int],
                         cache: Cache) -> tuple[npt.NDArray[np.float32], Cache]:
            if 99 in token_ids:
                raise ValueError("token 99 is not in the vocabulary")
            return np.full((len(token_ids), 4), token_ids[0], dtype=np.float32), cache

        def forward_trees(self, items: Sequence[tuple[Sequence[int], Sequence[int], Cache]]
                          ) -> list[tuple[npt.NDArray[np.float32], Cache]]:
            calls.append(len(items))
            return [self.forward_tree(*item) for item in items]

        def keep_path(self, tree: Cache, length: int, path: Sequence[int]) -> Cache:
            return tree

    def batch(first_tokens: list[int]) -> dict[int, float | str]:
        model = Trees()
        scheduler = ForwardScheduler(model, model, None, model)
        results: dict[int, float | str] = {}

        def worker(order: int) -> None:
            try:
                logits, _ = scheduler.submit(True, (order,), [first_tokens[order], 5],
                                             [-1, 0], Cache())
                results[order] = float(logits[0, 0])
            except ValueError as exc:
                results[order] = str(exc)
            finally:
                scheduler.leave()

        for _ in first_tokens:
            scheduler.enter()
        threads = [threading.Thread(target=worker, args=(order,))
                   for order in range(len(first_tokens))]
        with alarm(30):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return results

    assert batch([7, 8, 9]) == {0: 7.0, 1: 8.0, 2: 9.0} and calls == [3]
    calls.clear()
    assert batch([7, 99, 9]) == {0: 7.0, 1: "token 99 is not in the vocabulary", 2: 9.0}
    assert calls == [3]
