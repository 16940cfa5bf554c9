"""Fixtures for the constraint engine tests (the real SmolLM2 vocabulary is tests/conftest.py's
`smol_vocab`): a tiny hand-made byte vocabulary, a shared index cache, a random walk."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from qrun.constraint.regex_index import IndexCache, TokenIndex
from qrun.constraint.vocab import Vocabulary


@pytest.fixture(scope="session")
def smol_indexes() -> IndexCache:
    """One cache for the session, so tests share compiled indexes like a backend would."""
    return IndexCache(max_entries=256)


@pytest.fixture(scope="session")
def byte_vocab() -> Vocabulary:
    """All 256 single bytes plus a few merges (ids 256..), EOS = id 264 (no bytes)."""
    merges = [b"ab", b"abc", b"bc", b"12", b"-0", b'{"', b'":', b" \xc3", None]
    return Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + merges, [264])


@pytest.fixture(scope="session")
def random_walk() -> Callable[[TokenIndex, list[int], int], bytes]:
    """walk(index, choices, budget): sample among the allowed ids (with the budget) using
    `choices` as the random source until EOS; returns the bytes produced."""
    return _random_walk


def _random_walk(index: TokenIndex, choices: list[int], budget: int) -> bytes:
    """Sample uniformly among allowed ids (with budget) until EOS; returns the bytes."""
    cursor = index.start()
    out = bytearray()
    eos = set(index.vocab.eos_token_ids)
    for step, choice in enumerate(choices[:budget]):
        allowed = cursor.allowed(budget - step).nonzero()[0].tolist()
        assert allowed, "a reachable state has an empty budgeted mask"
        token_id = allowed[choice % len(allowed)]
        if token_id in eos:
            return bytes(out)
        cursor.advance(token_id)
        out += index.vocab.token_bytes[token_id] or b""
    assert cursor.can_end(), "budgeted masks must finish the match in time"
    return bytes(out)
