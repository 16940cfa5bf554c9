"""llama.cpp's thread count (qrun/backends/llamacpp.py llama_threads): every core on an idle
machine, one core fewer on a busy one, or what QRUN_LLAMACPP_THREADS says. No llama.cpp
needed: the choice is made before the library is loaded."""

from __future__ import annotations

import os

import pytest
import torch

from qrun.backends.llamacpp import llama_threads


@pytest.mark.parametrize(("cores", "torch_threads", "load", "expected"), [
    (2, 2, 0.1, 2),   # idle: every core
    (2, 2, 0.9, 1),   # about a core's worth of other work: leave it that core
    (2, 2, 6.0, 1),   # busy: one thread, which never waits on a preempted sibling
    (8, 4, 3.0, 4),   # torch's count (physical cores) fits beside the load
    (8, 4, 6.0, 2),   # two cores left free
    (1, 1, 3.0, 1),   # one core: one thread whatever the load
])
def test_the_default_follows_the_load(monkeypatch: pytest.MonkeyPatch, cores: int,
                                      torch_threads: int, load: float, expected: int) -> None:
    monkeypatch.delenv("QRUN_LLAMACPP_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_threads)
    assert llama_threads() == expected


def test_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setenv("QRUN_LLAMACPP_THREADS", "3")
    assert llama_threads() == 3
    monkeypatch.setenv("QRUN_LLAMACPP_THREADS", "zero")  # not a count: the default
    assert llama_threads() == 1
