"""A Hugging Face tokenizer's byte vocabulary (qrun/backends/hf_tokenizer.py vocabulary_of):
byte decoding of SmolLM2's byte-level BPE, special tokens, caching per tokenizer and size,
SentencePiece-style and unsupported tokenizers."""

from __future__ import annotations

from typing import Any

import pytest

from qrun.backends.hf_tokenizer import vocabulary_of
from qrun.constraint.vocab import Vocabulary, VocabularyError


def test_smollm2_bytes(smol_tokenizer: Any, smol_vocab: Vocabulary) -> None:
    vocab = smol_vocab
    assert vocab.size == 49152
    assert vocab.eos_token_ids == (2,)
    assert all(vocab.token_bytes[i] is None for i in range(17))  # specials
    the = smol_tokenizer.convert_tokens_to_ids("Ġthe")
    assert vocab.token_bytes[the] == b" the"
    assert vocab.max_token_len == 81
    assert sum(1 for b in vocab.token_bytes if b is not None and not _utf8(b)) == 313
    # Every printable ASCII byte and \n, \t is a single token (docs/internals.md §2).
    for byte in [*range(0x20, 0x7F), 0x0A, 0x09]:
        assert vocab.single_byte_tokens[byte]
    # Decoding a few ordinary ids agrees with the tokenizer's own decode.
    for token_id in [17, 300, 1000, 20000, 49151]:
        data = vocab.token_bytes[token_id]
        assert data is not None
        if _utf8(data):
            assert data.decode() == smol_tokenizer.decode([token_id])


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_cached_per_tokenizer_and_size(smol_tokenizer: Any, smol_vocab: Vocabulary) -> None:
    assert vocabulary_of(smol_tokenizer) is smol_vocab
    wider = vocabulary_of(smol_tokenizer, size=49160)
    assert wider.size == 49160 and wider.token_bytes[49155] is None
    assert vocabulary_of(smol_tokenizer, size=49160) is wider
    with pytest.raises(VocabularyError, match="smaller"):
        vocabulary_of(smol_tokenizer, size=100)


class _FakeTokenizer:
    """Just enough of the HF tokenizer interface for Vocabulary.from_tokenizer."""

    def __init__(self, pieces: list[str], specials: list[int], eos: int) -> None:
        self.pieces = pieces
        self.all_special_ids = specials
        self.added_tokens_decoder: dict[int, Any] = {}
        self.eos_token_id = eos

    def __len__(self) -> int:
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]


def test_sentencepiece_style() -> None:
    pieces = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "▁the", "é", "▁", "ab"]
    vocab = vocabulary_of(_FakeTokenizer(pieces, [0, 1, 2], eos=2))
    assert vocab.token_bytes == (
        None,
        None,
        None,
        b"\n",
        b"\xc3",
        b" the",
        "é".encode(),
        b" ",
        b"ab",
    )
    assert vocab.eos_token_ids == (2,)


def test_unsupported_tokenizer() -> None:
    with pytest.raises(VocabularyError, match="unsupported tokenizer"):
        vocabulary_of(_FakeTokenizer(["<s>", "hello world", "日本"], [0], eos=0))
