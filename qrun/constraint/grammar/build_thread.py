"""The thread where llguidance builds grammars: every LLMatcher compile
(qrun/constraint/grammar_index.py LlgIndex) and grammar validation (text.py) runs in one
long-lived daemon thread, and the caller waits for it.

Why: llguidance's Rust code allocates through glibc's malloc, and its grammar build is
allocation-bound (about a third of a large schema's compile in malloc and free, by `perf`).
glibc serves the main thread from the main arena, which the interpreter and torch have
fragmented by then; any other thread gets an arena of its own. The same compiles of the
MaskBench schemas near the p99 of time to first mask took 18 % less time in a thread
(10.6 against 12.9 ms, interleaved in one run; issue #24 item 4, bench/maskbench.py). The
builds lose no parallelism: each cache builds under its own lock (lru.py get_or_build).

Grammars a cache keeps (`built(..., kept=True)`: grammar_index.py LlgCache, from a grammar's
second use) build in a second thread, with an arena of its own: what they hold would
otherwise stay scattered through the arena where the next grammars build and slow them
(MaskBench's first-mask p99: 16.0 and 16.0 ms against 16.6 and 17.2 with one thread for all,
interleaved runs).

A forked child (a multiprocessing worker) starts its own threads on first use: the parent's
do not exist there."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["built"]

T = TypeVar("T")

_Job = tuple[Callable[[], object], "Future[object]"]


class _BuildThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def run(self, build: Callable[[], T]) -> T:
        done: Future[object] = Future()
        self._jobs.put((build, done))
        return done.result()  # type: ignore[return-value]  # build's own value

    def _serve(self) -> None:
        while True:
            build, done = self._jobs.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(build())
            except BaseException as exc:  # the caller's to handle: raised there by result()
                done.set_exception(exc)
            # Hold nothing of a finished build while waiting for the next: what it built
            # (and the closure that built it) goes when its caller drops it.
            del build, done


# By `kept`: the thread for grammars built for one use, and the one for grammars kept.
_threads: dict[bool, _BuildThread] = {}
_start_lock = threading.Lock()
_NAMES = {False: "qrun-llguidance-build", True: "qrun-llguidance-build-kept"}


def _forget() -> None:
    """In a forked child: no build thread yet, and a lock no thread of the parent holds."""
    global _threads, _start_lock
    _threads, _start_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def built(build: Callable[[], T], kept: bool = False) -> T:
    """`build()` run in the build thread (with `kept`, the one for grammars a cache keeps):
    its value, or its exception raised here. Called from a build thread, it runs in place."""
    here = threading.current_thread()
    if any(here is running.thread for running in list(_threads.values())):
        return build()
    current = _threads.get(kept)
    if current is None:
        with _start_lock:
            current = _threads.get(kept)
            if current is None:
                current = _threads[kept] = _BuildThread(_NAMES[kept])
    return current.run(build)
