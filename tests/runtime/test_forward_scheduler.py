"""ForwardScheduler (qrun/runtime/scheduler.py), the loop that batches the forwards of runs in
threads (run_many, qrun serve): what it keeps once a batch is done."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from qrun.runtime.scheduler import ForwardScheduler
from tests.hang import alarm, wait_until


class Cache:
    """A stand-in KV cache: only its lifetime matters here."""


class Model:
    prefix_cache = None

    def new_cache(self) -> Cache:
        return Cache()

    def forward(self, token_ids: Sequence[int], cache: Cache,
                logits_for: int = 1) -> npt.NDArray[np.float32]:
        return np.zeros((logits_for, 4), dtype=np.float32)


def test_an_idle_loop_keeps_no_cache_of_the_last_batch() -> None:
    # A served model idle between requests must not hold the last batch's KV (llama.cpp's
    # sequences, tests/serve/test_serve_llamacpp.py): the loop drops its requests once done.
    scheduler = ForwardScheduler(Model(), None, None)
    stop = threading.Event()
    loop = threading.Thread(target=scheduler.serve, args=(stop.is_set,), daemon=True)
    loop.start()
    cache = Cache()
    alive = weakref.ref(cache)
    scheduler.enter()
    logits = scheduler.submit(False, (0,), [1, 2], cache, 1)
    scheduler.leave()
    assert logits.shape == (1, 4)
    del cache
    gc.collect()
    try:
        assert loop.is_alive() and alive() is None
    finally:
        stop.set()
        with alarm(30):
            wait_until(lambda: not loop.is_alive())
