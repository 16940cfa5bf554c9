"""Python's cycle collector held off around work that allocates a great many objects and makes
no reference cycles, where the collections those allocations set off would walk the whole heap
for nothing: a JSON Schema's rewrite and compile (qrun/constraint/grammar/text.py, issue #24's
time to first mask) and a template's analysis in `qrun lsp` (qrun/lsp/server.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off inside, restored as it was whatever happens. Process-wide (so
    another thread's allocations are not collected either meanwhile); two threads inside at
    once leave it on when both are out, if it was on before the first came in."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
