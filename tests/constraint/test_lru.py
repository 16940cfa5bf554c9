"""The constraint core's one bounded LRU (qrun/constraint/lru.py): recency order, eviction,
build-once under the lock, nothing stored when a build fails, and keeping a value from its
key's second use."""

from __future__ import annotations

import gc
import weakref

import pytest

from qrun.constraint.lru import Lru


def test_the_least_recently_used_goes_first() -> None:
    cache: Lru[str, int] = Lru(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)


def test_a_value_is_built_once_and_a_failed_build_stores_nothing() -> None:
    cache: Lru[str, list[int]] = Lru(4)
    built: list[str] = []
    first = cache.get_or_build("k", lambda: built.append("k") or [1])
    assert cache.get_or_build("k", lambda: built.append("again") or [2]) is first
    assert built == ["k"]

    def fail() -> list[int]:
        raise ValueError("refused")

    with pytest.raises(ValueError):
        cache.get_or_build("bad", fail)
    assert cache.get("bad") is None and len(cache) == 1


def test_it_needs_room_for_one() -> None:
    with pytest.raises(ValueError):
        Lru(0)


def test_a_weight_bound_evicts_the_oldest_until_it_holds() -> None:
    cache: Lru[str, int] = Lru(10, max_weight=6, weight=len)
    for key in ("aa", "bb", "cc"):
        cache.put(key, 0)
    cache.put("ddd", 0)  # 9 > 6: "aa" then "bb" go
    assert [cache.get(k) is not None for k in ("aa", "bb", "cc", "ddd")] == [False, False,
                                                                             True, True]
    cache.put("ddd", 1)  # the same key again weighs once
    assert cache.get("cc") == 0 and len(cache) == 2
    cache.put("x" * 20, 0)  # the newest stays, whatever it weighs
    assert len(cache) == 1 and cache.get("x" * 20) == 0


def test_a_weight_bound_needs_its_weight() -> None:
    with pytest.raises(ValueError, match="together"):
        Lru(4, max_weight=10)


class _Value:
    """A value that takes weak references (keep_from_second_use needs them)."""


def test_keep_from_second_use_holds_a_first_value_only_while_it_is_used() -> None:
    cache: Lru[str, _Value] = Lru(4, keep_from_second_use=True)
    builds: list[str] = []

    def build(key: str) -> _Value:
        builds.append(key)
        return _Value()

    first = cache.get_or_build("a", lambda: build("a"))
    assert len(cache) == 0  # not kept: only shared while held
    assert cache.get_or_build("a", lambda: build("a")) is first  # the second use keeps it
    assert len(cache) == 1 and builds == ["a"]
    del first
    assert cache.get_or_build("a", lambda: build("a")) is not None and builds == ["a"]

    gone = weakref.ref(cache.get_or_build("b", lambda: build("b")))
    gc.collect()
    assert gone() is None  # asked for once and dropped: nothing keeps it alive
    again = cache.get_or_build("b", lambda: build("b"))  # asked again: built again, and kept
    assert builds == ["a", "b", "b"] and len(cache) == 2
    assert cache.get_or_build("b", lambda: build("b")) is again and builds == ["a", "b", "b"]


def test_keep_from_second_use_still_evicts_and_still_stores_no_failure() -> None:
    cache: Lru[str, _Value] = Lru(1, keep_from_second_use=True)
    kept = [cache.get_or_build(key, _Value) for key in ("a", "a", "b", "b")]
    assert kept[0] is kept[1] and kept[2] is kept[3] and len(cache) == 1
    assert cache.get("a") is None and cache.get("b") is kept[2]  # "a" was evicted

    def fail() -> _Value:
        raise ValueError("refused")

    for _ in range(2):
        with pytest.raises(ValueError):
            cache.get_or_build("bad", fail)
    assert cache.get("bad") is None and len(cache) == 1
