"""Torch work done in a thread that ends before the caller goes on, so that no OpenMP thread
team stays behind in the caller's thread.

Why: PyTorch's CPU build runs its intra-op parallelism on GNU OpenMP (libgomp). Each thread
that enters a parallel region gets a team of worker threads that stays with it until the
thread ends, and libgomp counts every such worker: once they outnumber the CPUs, its workers
spin about 100 times instead of ~300,000 before they sleep, so every op of a forward wakes them
through the kernel. A server loads its model in the main thread and runs the forwards in
another one (qrun/runtime/scheduler.py, the `qrun-forwards` thread): with the loading's team
kept by the main thread, SmolLM2 on 2 cores and 2 torch threads ran the bench's extraction
runs 30 % slower in that thread than in the main one (2.7 against 3.9 runs/s); loaded in a
passing thread instead, 4.0 (issue #26's one-client target, bench/serve.py). The same is why
batches run in that one thread, not in the threads of the runs (issue #36)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(work: Callable[[], T]) -> T:
    """`work()` run in a new thread, joined before returning: its value, or its exception
    raised here."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # raised again in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="qrun-load", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
