"""llama.cpp's thread count (qrun/backends/llamacpp.py llama_threads): every physical core on
an idle machine, one core fewer on a busy one, or what QRUN_LLAMACPP_THREADS says. No llama.cpp
needed: the choice is made before the library is loaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qrun.backends import llamacpp
from qrun.backends.llamacpp import llama_threads, physical_cores


@pytest.mark.parametrize(("cpus", "cores", "load", "expected"), [
    (2, 2, 0.1, 2),   # idle: every core
    (2, 2, 0.9, 1),   # about a core's worth of other work: leave it that core
    (2, 2, 6.0, 1),   # busy: one thread, which never waits on a preempted sibling
    (8, 4, 3.0, 4),   # the physical cores fit beside the load
    (8, 4, 6.0, 2),   # two logical CPUs left free
    (1, 1, 3.0, 1),   # one core: one thread whatever the load
])
def test_the_default_follows_the_load(monkeypatch: pytest.MonkeyPatch, cpus: int, cores: int,
                                      load: float, expected: int) -> None:
    monkeypatch.delenv("QRUN_LLAMACPP_THREADS", raising=False)
    monkeypatch.setattr(llamacpp, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(llamacpp, "physical_cores", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert llama_threads() == expected


def test_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
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
    monkeypatch.setattr(llamacpp, "Path", fake_path)
    assert physical_cores() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert physical_cores() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2})
    assert physical_cores() == 1
