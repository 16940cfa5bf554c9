"""The constraint core's one bounded LRU (qrun/constraint/lru.py): recency order, eviction,
build-once under the lock, nothing stored when a build fails."""

from __future__ import annotations

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
