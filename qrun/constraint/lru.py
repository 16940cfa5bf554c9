"""The bounded, thread-safe LRU every per-process cache of the constraint core uses: token
indexes (regex_index.py IndexCache, grammar_index.py LlgCache), lowered constraints
(spec.py) and healing masks (healing.py). One place for the lock, the recency order and the
eviction, instead of a hand-written OrderedDict in each."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Lru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most `max_entries` values by key, and with `weight` (of a key), at most
    `max_weight` in all (the newest entry stays whatever it weighs); the least recently used
    one goes first.

    With `keep_from_second_use`, a value get_or_build builds is kept from the second time its
    key is asked for: the first time it is only weakly held, shared while its users hold it
    and gone with them. A stream of keys each asked for once then keeps nothing alive; a key
    asked for again after its value went is built once more, and kept. (Why LlgCache wants
    this: compiled grammars kept alive slow llguidance's next compiles; grammar_index.py.)
    The values must take weak references."""

    def __init__(self, max_entries: int, max_weight: int | None = None,
                 weight: Callable[[K], int] | None = None,
                 keep_from_second_use: bool = False) -> None:
        if max_entries < 1:
            raise ValueError("an Lru needs max_entries >= 1")
        if (max_weight is None) != (weight is None):
            raise ValueError("an Lru takes max_weight and weight together")
        self._max_entries = max_entries
        self._max_weight, self._weight = max_weight, weight
        self._total = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, V] = OrderedDict()
        # keep_from_second_use: values built once and still in use, and the hashes of the
        # keys asked for once (a bounded record: a key it forgot counts as new again).
        self._once: weakref.WeakValueDictionary[K, V] | None = (
            weakref.WeakValueDictionary() if keep_from_second_use else None)
        self._asked: OrderedDict[int, None] = OrderedDict()

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

    def get_or_build(self, key: K, build: Callable[[], V],
                     build_kept: Callable[[], V] | None = None) -> V:
        """The value of `key`, built on first use under the lock, so two threads never build
        the same value twice while it is held (an exception from a build stores nothing).
        A value the cache is to keep is built by `build_kept` where given, others by `build`
        (with keep_from_second_use, the cache keeps a value from its key's second use)."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                return value
            if self._once is not None:
                value = self._once.pop(key, None)
                if value is None and self._first_use(key):
                    value = build()
                    self._once[key] = value
                    return value
            if value is None:
                value = (build_kept or build)()
            self._put(key, value)
            return value

    def _first_use(self, key: K) -> bool:
        """Whether `key` is asked for the first time (as far as the bounded record of keys
        goes), recording it."""
        digest = hash(key)
        if digest in self._asked:
            self._asked.move_to_end(digest)
            return False
        self._asked[digest] = None
        if len(self._asked) > 16 * self._max_entries:
            self._asked.popitem(last=False)
        return True

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
