"""The bounded, thread-safe LRU every per-process cache of the constraint core uses: token
indexes (regex_index.py IndexCache, grammar_index.py LlgCache), lowered constraints
(spec.py) and healing masks (healing.py). One place for the lock, the recency order and the
eviction, instead of a hand-written OrderedDict in each."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Lru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most `max_entries` values by key, and with `weight` (of a key), at most
    `max_weight` in all (the newest entry stays whatever it weighs); the least recently used
    one goes first."""

    def __init__(self, max_entries: int, max_weight: int | None = None,
                 weight: Callable[[K], int] | None = None) -> None:
        if max_entries < 1:
            raise ValueError("an Lru needs max_entries >= 1")
        if (max_weight is None) != (weight is None):
            raise ValueError("an Lru takes max_weight and weight together")
        self._max_entries = max_entries
        self._max_weight, self._weight = max_weight, weight
        self._total = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value of `key` (now the most recently used), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._put(key, value)

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The value of `key`, built by `build` on first use under the lock, so two threads
        never build the same value twice (an exception from `build` stores nothing)."""
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                value = build()
                self._put(key, value)
            else:
                self._entries.move_to_end(key)
            return value

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: K, value: V) -> None:
        if self._weight is not None and key not in self._entries:
            self._total += self._weight(key)
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries or (
                self._max_weight is not None and self._total > self._max_weight
                and len(self._entries) > 1):
            old, _ = self._entries.popitem(last=False)
            if self._weight is not None:
                self._total -= self._weight(old)
