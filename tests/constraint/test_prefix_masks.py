"""Healing masks equal a brute-force check of every token in the real vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from qrun.backends.transformers import TransformersBackend
from qrun.constraint.healing import PrefixMasks


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
