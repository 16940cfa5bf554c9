"""Healing masks equal a brute-force check of every token in the real vocabulary, and the
cursor of a healed hole moves on them and back."""

from __future__ import annotations

import numpy as np
import pytest

from qrun.backends.transformers import TransformersBackend
from qrun.constraint.healing import HealCursor, PrefixMasks


@pytest.mark.parametrize("prefix", [b" ", b":", b" Par", b"http:", b"\xc3", b"\n\n", b"ing"])
def test_prefix_mask_matches_brute_force(tiny: TransformersBackend, prefix: bytes) -> None:
    vocab = tiny.vocabulary
    mask = PrefixMasks(vocab).compatible(prefix)
    expected = np.array([
        bool(data) and (data.startswith(prefix) or prefix.startswith(data))
        for data in vocab.token_bytes
    ])
    assert np.array_equal(mask, expected)
    assert int(mask.sum()) > 0


def test_everything_allows_ordinary_tokens_and_eos_only(tiny: TransformersBackend) -> None:
    vocab = tiny.vocabulary
    mask = PrefixMasks(vocab).everything()
    for token_id, data in enumerate(vocab.token_bytes):
        assert bool(mask[token_id]) == (bool(data) or token_id in vocab.eos_token_ids)


def test_the_heal_cursor_consumes_and_rolls_back(tiny: TransformersBackend) -> None:
    vocab = tiny.vocabulary
    cursor = HealCursor(PrefixMasks(vocab), b" Paris")
    space = vocab.ids_of(b" ")[0]
    assert not cursor.consume(vocab.ids_of(b"x")[0]) and cursor.remaining == b" Paris"
    assert cursor.consume(space) and cursor.remaining == b"Paris"
    fork = cursor.copy()
    assert fork.consume(vocab.ids_of(b"Paris")[0]) and fork.can_end()
    fork.rollback(1)
    assert fork.remaining == b"Paris" and not fork.can_end()
    fork.rollback(1)
    assert fork.remaining == b" Paris" and cursor.remaining == b"Paris"
    with pytest.raises(ValueError, match="cannot roll back 1 tokens"):
        fork.rollback(1)
