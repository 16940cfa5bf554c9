"""The byte view of a tokenizer's vocabulary, built once per tokenizer: what bytes each token id
stands for, plus the level-ordered token trie that masks.py walks through a DFA in numpy."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["TokenTrie", "Vocabulary", "VocabularyError"]

# SentencePiece marks a leading space with U+2581 and spells raw bytes as <0xNN>.
_SP_SPACE = "\u2581"
_SP_BYTE_PREFIX, _SP_BYTE_LEN = "<0x", 6


class VocabularyError(ValueError):
    """The tokenizer's token strings cannot be mapped to bytes (unsupported tokenizer kind)."""


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the other 68
    bytes to U+0100.. in order. Byte-level BPE token strings are spelled in these characters."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF_CHAR = _gpt2_unicode_to_byte()


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class TokenTrie:
    """All ordinary tokens' byte strings as a trie stored level by level, for vectorised walks.

    Level d (1-based, d <= max_len) holds the distinct d-byte prefixes, sorted by (parent, byte):
    `byte[d]` uint8 [n_d], and for the nodes of level d-1 the contiguous range of their children,
    `child_start[d-1]` / `child_count[d-1]` int64 [n_{d-1}] (level 0 is the root alone).
    `token_at[d]` int64 [n_d] is the token id ending at that node, or -1. Token ids with the same
    bytes as an earlier id are listed in `duplicates` as (id, representative id).
    """

    byte: tuple[npt.NDArray[np.uint8], ...]
    child_start: tuple[npt.NDArray[np.int64], ...]
    child_count: tuple[npt.NDArray[np.int64], ...]
    token_at: tuple[npt.NDArray[np.int64], ...]
    duplicates: tuple[tuple[int, int], ...]

    def __repr__(self) -> str:
        return f"TokenTrie(max_len={self.max_len}, nodes={sum(len(b) for b in self.byte)})"

    @property
    def max_len(self) -> int:
        return len(self.byte) - 1

    @staticmethod
    def build(token_bytes: Sequence[bytes | None]) -> TokenTrie:
        """Build from per-id bytes (None and empty entries are left out)."""
        first_id: dict[bytes, int] = {}
        duplicates: list[tuple[int, int]] = []
        for token_id, data in enumerate(token_bytes):
            if not data:
                continue
            if data in first_id:
                duplicates.append((token_id, first_id[data]))
            else:
                first_id[data] = token_id
        prefixes: set[bytes] = set()
        for data in first_id:
            prefixes.update(data[:i] for i in range(1, len(data) + 1))
        max_len = max((len(p) for p in prefixes), default=0)
        levels: list[list[bytes]] = [[] for _ in range(max_len + 1)]
        levels[0].append(b"")
        for prefix in prefixes:
            levels[len(prefix)].append(prefix)
        index: dict[bytes, int] = {b"": 0}
        bytes_out: list[npt.NDArray[np.uint8]] = [np.zeros(0, dtype=np.uint8)]
        tokens_out: list[npt.NDArray[np.int64]] = [np.full(1, -1, dtype=np.int64)]
        starts: list[npt.NDArray[np.int64]] = []
        counts: list[npt.NDArray[np.int64]] = []
        for depth in range(1, max_len + 1):
            # Sorting by (parent index, last byte) makes each parent's children contiguous.
            level = sorted(levels[depth], key=lambda p: (index[p[:-1]], p[-1]))
            for i, prefix in enumerate(level):
                index[prefix] = i
            parents = np.array([index[p[:-1]] for p in level], dtype=np.int64)
            count = np.bincount(parents, minlength=len(levels[depth - 1])).astype(np.int64)
            counts.append(count)
            starts.append(np.cumsum(count) - count)
            bytes_out.append(np.array([p[-1] for p in level], dtype=np.uint8))
            tokens_out.append(np.array([first_id.get(p, -1) for p in level], dtype=np.int64))
        empty = np.zeros(0, dtype=np.int64)
        starts.append(empty)
        counts.append(empty)
        for group in (bytes_out, tokens_out, starts, counts):
            for array in group:
                array.flags.writeable = False
        return TokenTrie(
            tuple(bytes_out), tuple(starts), tuple(counts), tuple(tokens_out), tuple(duplicates)
        )


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Vocabulary:
    """A tokenizer's vocabulary as bytes.

    token_bytes: per id (length `size`), the bytes the token stands for, or None for special /
        added tokens and ids past the tokenizer's length: those are never allowed inside holes.
    eos_token_ids: ids that end generation (allowed by a mask iff the constraint accepts).
    size: the model's vocabulary size V (logits width; may exceed len(tokenizer)).
    trie: the level-ordered trie of all ordinary tokens (see TokenTrie).
    single_byte_tokens: bool [256], which byte values are a token on their own; distances in
        bytes over these bytes bound the number of tokens still needed (docs/internals.md §3.8).
    Identity-compared (eq=False): build one per tokenizer with `from_tokenizer`.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: tuple[int, ...]
    trie: TokenTrie
    single_byte_tokens: npt.NDArray[np.bool_]
    _extendable: frozenset[bytes]
    _ids: Mapping[bytes, tuple[int, ...]]

    def __repr__(self) -> str:
        return f"Vocabulary(size={self.size}, eos_token_ids={self.eos_token_ids})"

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @property
    def max_token_len(self) -> int:
        return self.trie.max_len

    def is_token(self, data: bytes) -> bool:
        """Whether some ordinary token's bytes are exactly `data`."""
        return data in self._ids

    def ids_of(self, data: bytes) -> tuple[int, ...]:
        """Every token id whose bytes are exactly `data` (several when duplicated)."""
        return self._ids.get(data, ())

    def has_extension(self, data: bytes) -> bool:
        """Whether some token's bytes properly start with `data` (token healing asks this of the
        last token before a hole: if true, the hole could have continued it)."""
        return data in self._extendable

    @staticmethod
    def from_token_bytes(
        token_bytes: Sequence[bytes | None], eos_token_ids: Sequence[int]
    ) -> Vocabulary:
        """Build from explicit per-id bytes (tests, non-HF tokenizers)."""
        cleaned = tuple(data if data else None for data in token_bytes)
        for eos in eos_token_ids:
            if not 0 <= eos < len(cleaned):
                raise VocabularyError(f"eos id {eos} is outside the vocabulary (0..{len(cleaned)})")
        singles = np.zeros(256, dtype=np.bool_)
        extendable: set[bytes] = set()
        for data in cleaned:
            if data is None:
                continue
            if len(data) == 1:
                singles[data[0]] = True
            extendable.update(data[:i] for i in range(len(data)))
        singles.flags.writeable = False
        ids: dict[bytes, tuple[int, ...]] = {}
        for token_id, data in enumerate(cleaned):
            if data is not None:
                ids[data] = (*ids.get(data, ()), token_id)
        trie = TokenTrie.build(cleaned)
        return Vocabulary(
            cleaned, tuple(eos_token_ids), trie, singles, frozenset(extendable), ids
        )

    @staticmethod
    def from_tokenizer(tokenizer: Any, size: int | None = None) -> Vocabulary:
        """The vocabulary of a Hugging Face tokenizer, cached per tokenizer object (and size).

        Byte-level BPE token strings are decoded by inverting GPT-2's `bytes_to_unicode`;
        SentencePiece-style ones (`▁` for space, `<0xNN>` byte tokens) are also understood.

        Raises:
            VocabularyError: the token strings are neither byte-level nor SentencePiece-style,
                or `size` is smaller than the tokenizer.
        """
        return _CACHE.get(tokenizer, size)


class _VocabularyCache:
    """Vocabularies keyed weakly by tokenizer object: built once, dropped with the tokenizer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tokenizer: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], Vocabulary]]
        self._by_tokenizer = weakref.WeakKeyDictionary()

    def get(self, tokenizer: Any, size: int | None) -> Vocabulary:
        length = len(tokenizer)
        key = (length, length if size is None else size)
        with self._lock:
            built = self._by_tokenizer.setdefault(tokenizer, {})
            if key not in built:
                built[key] = _build_from_tokenizer(tokenizer, key[1])
            return built[key]


_CACHE = _VocabularyCache()


def _build_from_tokenizer(tokenizer: Any, size: int) -> Vocabulary:
    length = len(tokenizer)
    if size < length:
        raise VocabularyError(
            f"model vocabulary size {size} is smaller than the tokenizer ({length})"
        )
    special = set(getattr(tokenizer, "all_special_ids", ()))
    special.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
    pieces: list[str | None] = list(tokenizer.convert_ids_to_tokens(list(range(length))))
    ordinary = [p for i, p in enumerate(pieces) if i not in special and p is not None]
    decode = _pick_decoder(ordinary)
    token_bytes: list[bytes | None] = [
        None if i in special or piece is None else decode(piece) for i, piece in enumerate(pieces)
    ]
    token_bytes.extend([None] * (size - length))
    eos = _eos_ids(tokenizer)
    return Vocabulary.from_token_bytes(token_bytes, eos)


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list | tuple) else [int(eos)]


def _pick_decoder(pieces: Sequence[str]) -> Any:
    """Byte-level if every ordinary piece is spelled in the GPT-2 byte alphabet, SentencePiece if
    the vocabulary has `▁` pieces and <0xNN> byte pieces; otherwise unsupported."""
    if all(all(ch in _BYTE_OF_CHAR for ch in piece) for piece in pieces):
        return _decode_byte_level
    has_byte_pieces = any(_is_sp_byte(p) for p in pieces)
    if has_byte_pieces and any(_SP_SPACE in p for p in pieces):
        return _decode_sentencepiece
    bad = next(p for p in pieces if not all(ch in _BYTE_OF_CHAR for ch in p))
    raise VocabularyError(
        f"unsupported tokenizer: token {bad!r} is neither byte-level BPE (GPT-2 byte alphabet) "
        "nor SentencePiece with <0xNN> byte tokens, so token bytes cannot be known exactly"
    )


def _decode_byte_level(piece: str) -> bytes:
    return bytes(_BYTE_OF_CHAR[ch] for ch in piece)


def _is_sp_byte(piece: str) -> bool:
    return (
        len(piece) == _SP_BYTE_LEN
        and piece.startswith(_SP_BYTE_PREFIX)
        and piece.endswith(">")
        and all(c in "0123456789ABCDEFabcdef" for c in piece[3:5])
    )


def _decode_sentencepiece(piece: str) -> bytes:
    # The tokenizer's own "add a leading space" normalisation is a tokenizer concern; here a
    # `▁` is simply the space byte it stands for inside the text.
    if _is_sp_byte(piece):
        return bytes([int(piece[3:5], 16)])
    return piece.replace(_SP_SPACE, " ").encode("utf-8")
