"""backends/passing_thread.py: torch work in a thread that ends, so the caller's thread keeps
no OpenMP team (the one that made a served model's forwards 30 % slower, issue #26)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from qrun.backends.passing_thread import in_passing_thread


def test_the_work_runs_in_a_thread_that_has_ended_when_its_value_comes_back() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 42

    assert in_passing_thread(work) == 42
    assert seen[0] is not threading.current_thread()
    assert not seen[0].is_alive()


def test_the_works_exception_is_raised_in_the_caller() -> None:
    def work() -> None:
        raise ValueError("bad folder")

    with pytest.raises(ValueError, match="bad folder"):
        in_passing_thread(work)


PROBE = """
import os, sys, time, torch
torch.set_num_threads(2)
from qrun.backends import load_model
tasks = lambda: len(os.listdir("/proc/self/task"))
before = tasks()
backend = load_model(sys.argv[1])
# The ended thread's OpenMP workers leave on their own, a few ms later: wait for that (a team
# that stays with a living thread never leaves, and the count stays higher).
deadline = time.monotonic() + 10
while tasks() != before and time.monotonic() < deadline:
    time.sleep(0.01)
after_load = tasks()
backend.forward(list(range(1, 300)), backend.new_cache())
print(before, after_load, tasks())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_loading_a_model_leaves_no_thread_behind(tiny_folder: str) -> None:
    # Two torch threads: a load's parallel ops made a team of one more thread, which stayed
    # in the caller's thread for the process's life. The probe's forward, in its own thread,
    # shows that the count would see such a team.
    proc = subprocess.run([sys.executable, "-c", PROBE, tiny_folder], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before, after_load, after_forward = map(int, proc.stdout.split())
    assert after_load == before
    assert after_forward > before
