"""llama.cpp's thread count (qrun/backends/llama_threads.py): every physical core on
an idle machine, one core fewer for each CPU that other work keeps busy now, or what
QRUN_LLAMACPP_THREADS says. No llama.cpp needed: the choice is made before the library is
loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qrun.backends import llama_threads as threads
from qrun.backends.llama_threads import llama_threads, physical_cores


@pytest.mark.parametrize(("cpus", "cores", "load", "expected"), [
    (2, 2, 0.0, 2),   # idle: every core
    (2, 2, 1.0, 1),   # a core's worth of other work: leave it that core
    (2, 2, 6.0, 1),   # busy: one thread, which never waits on a preempted sibling
    (8, 4, 3.0, 4),   # the physical cores fit beside the load
    (8, 4, 6.0, 2),   # two logical CPUs left free
    (1, 1, 3.0, 1),   # one core: one thread whatever the load
])
def test_the_default_follows_other_work(monkeypatch: pytest.MonkeyPatch, cpus: int, cores: int,
                                        load: float, expected: int) -> None:
    monkeypatch.delenv("QRUN_LLAMACPP_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(threads, "physical_cores", lambda: cores)
    monkeypatch.setattr(threads, "other_work", lambda: load)
    assert llama_threads() == expected


class _Stat:
    """/proc/stat whose procs_running line gives the next of `counts` at each read."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = iter(counts)

    def read_text(self) -> str:
        return f"cpu  1 2 3 4\nprocs_running {next(self.counts)}\nprocs_blocked 0\n"


def test_other_work_is_the_median_of_instant_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one-minute load average says 9; what runs now is this thread alone, but for one
    # read where a task woke briefly: nothing else is busy.
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(threads, "PROC_STAT", _Stat([1, 1, 4, 1, 1, 1, 1, 1, 1]))
    assert threads.other_work() == 0.0
    # Two other tasks running at most reads: two CPUs busy.
    monkeypatch.setattr(threads, "PROC_STAT", _Stat([3, 3, 1, 3, 3, 2, 3, 3, 3]))
    assert threads.other_work() == 2.0


def test_without_proc_stat_the_load_average_counts(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "missing")
    assert threads.other_work() == 1.5
    (tmp_path / "odd").write_text("cpu 1 2 3\n")  # no procs_running line
    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "odd")
    assert threads.other_work() == 1.5


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc/stat")
def test_busy_processes_are_seen() -> None:
    # Two processes spinning on the CPU are running or waiting for a CPU at every reading.
    spin = "import time\nprint(flush=True)\nend = time.time() + 20\nwhile time.time() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
                for _ in range(2)]
    try:
        for spinner in spinners:
            assert spinner.stdout is not None and spinner.stdout.readline() == b"\n"
        assert threads.other_work() >= 2
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
            assert spinner.stdout is not None
            spinner.stdout.close()


def test_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine pinned too: on 16 CPUs, 16 - 9 leaves 7 free (seen on a GPU machine).
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads, "other_work", lambda: 9.0)
    monkeypatch.setenv("QRUN_LLAMACPP_THREADS", "3")
    assert llama_threads() == 3
    monkeypatch.setenv("QRUN_LLAMACPP_THREADS", "zero")  # not a count: the default
    assert llama_threads() == 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity and sysfs")
def test_hyperthreads_of_one_core_count_once(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    # Four logical CPUs, two per core (what sysfs shows on a 2-core machine with SMT).
    topology = {0: ("0", "0"), 1: ("0", "1"), 2: ("0", "0"), 3: ("0", "1")}
    real_path = Path

    def fake_path(text: str) -> Path:
        prefix = "/sys/devices/system/cpu/cpu"
        if not text.startswith(prefix):
            return real_path(text)
        cpu = int(text[len(prefix):].split("/")[0])
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "physical_package_id").write_text(topology[cpu][0] + "\n")
        (folder / "core_id").write_text(topology[cpu][1] + "\n")
        return folder

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "Path", fake_path)
    assert physical_cores() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert physical_cores() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2})
    assert physical_cores() == 1
