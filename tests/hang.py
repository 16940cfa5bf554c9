"""A guard for tests of work that used to hang: `with alarm(seconds):` raises Hang in the main
thread when the block runs longer (SIGALRM), so a regression fails instead of stalling CI;
and `wait_until`, the poll such a block holds."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class Hang(Exception):
    """Raised by the alarm: the guarded block did not finish in time."""


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def ring(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll `condition` (callers hold an alarm: a regression fails instead of hanging)."""
    while not condition():
        time.sleep(0.01)
