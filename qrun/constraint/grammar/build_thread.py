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

A forked child (a multiprocessing worker) starts its own thread on first use: the parent's
does not exist there."""

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
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="qrun-llguidance-build",
                                       daemon=True)
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


_current: _BuildThread | None = None
_start_lock = threading.Lock()


def _forget() -> None:
    """In a forked child: no build thread yet, and a lock no thread of the parent holds."""
    global _current, _start_lock
    _current, _start_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def built(build: Callable[[], T]) -> T:
    """`build()` run in the build thread: its value, or its exception raised here. Called from
    the build thread itself, it runs in place."""
    global _current
    current = _current
    if current is None:
        with _start_lock:
            if _current is None:
                _current = _BuildThread()
            current = _current
    if threading.current_thread() is current.thread:
        return build()
    return current.run(build)
