"""The server tests' per-test gate (tests/serve/serving.py GATE): closed and counting from
zero at the start of a test, opened at its end so no run is left waiting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serve.serving import GATE, Gate


@pytest.fixture
def gate() -> Iterator[Gate]:
    GATE.reset()
    try:
        yield GATE
    finally:
        GATE.open.set()
