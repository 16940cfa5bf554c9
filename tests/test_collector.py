"""qrun/collector.py: the cycle collector paused inside, and restored as it was."""

from __future__ import annotations

import gc

import pytest

from qrun.collector import collector_paused


def test_the_collector_is_paused_inside_and_restored_as_it_was() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause left it as it found it
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a failure inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
