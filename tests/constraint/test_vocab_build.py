"""The vectorised vocabulary build (qrun/constraint/vocab.py) gives exactly what the former
per-prefix Python build gave: every trie array (values, dtype, shape, read-only), the duplicates,
the single-byte table and every query, on random vocabularies and on SmolLM2's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qrun.constraint.vocab import TokenTrie, Vocabulary


@dataclass(frozen=True)
class Reference:
    """What the former build gave (its code is copied into `reference` as the specification):
    every prefix of every distinct token in a set, each level sorted by (parent, last byte)."""

    byte: list[npt.NDArray[np.uint8]]
    child_start: list[npt.NDArray[np.int64]]
    child_count: list[npt.NDArray[np.int64]]
    token_at: list[npt.NDArray[np.int64]]
    duplicates: list[tuple[int, int]]
    singles: npt.NDArray[np.bool_]
    extendable: set[bytes]
    ids: dict[bytes, tuple[int, ...]]


def reference(token_bytes: Sequence[bytes | None]) -> Reference:
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
    byte: list[npt.NDArray[np.uint8]] = [np.zeros(0, dtype=np.uint8)]
    token_at: list[npt.NDArray[np.int64]] = [np.full(1, -1, dtype=np.int64)]
    starts: list[npt.NDArray[np.int64]] = []
    counts: list[npt.NDArray[np.int64]] = []
    for depth in range(1, max_len + 1):
        level = sorted(levels[depth], key=lambda p: (index[p[:-1]], p[-1]))
        for i, prefix in enumerate(level):
            index[prefix] = i
        parents = np.array([index[p[:-1]] for p in level], dtype=np.int64)
        count = np.bincount(parents, minlength=len(levels[depth - 1])).astype(np.int64)
        counts.append(count)
        starts.append(np.cumsum(count) - count)
        byte.append(np.array([p[-1] for p in level], dtype=np.uint8))
        token_at.append(np.array([first_id.get(p, -1) for p in level], dtype=np.int64))
    starts.append(np.zeros(0, dtype=np.int64))
    counts.append(np.zeros(0, dtype=np.int64))
    singles = np.zeros(256, dtype=np.bool_)
    extendable: set[bytes] = set()
    ids: dict[bytes, tuple[int, ...]] = {}
    for token_id, data in enumerate(token_bytes):
        if not data:
            continue
        if len(data) == 1:
            singles[data[0]] = True
        extendable.update(data[:i] for i in range(len(data)))
        ids[data] = (*ids.get(data, ()), token_id)
    return Reference(byte, starts, counts, token_at, duplicates, singles, extendable, ids)


def assert_same_trie(trie: TokenTrie, ref: Reference) -> None:
    for name in ("byte", "child_start", "child_count", "token_at"):
        got, want = getattr(trie, name), getattr(ref, name)
        assert len(got) == len(want), name
        for depth, (array, expected) in enumerate(zip(got, want, strict=True)):
            assert array.dtype == expected.dtype, (name, depth)
            assert array.shape == expected.shape, (name, depth)
            assert np.array_equal(array, expected), (name, depth)
            assert not array.flags.writeable, (name, depth)
    assert trie.duplicates == tuple(ref.duplicates)
    assert trie.max_len == len(ref.byte) - 1


def assert_same_vocabulary(token_bytes: Sequence[bytes | None], queries: Sequence[bytes]) -> None:
    vocab = Vocabulary.from_token_bytes(token_bytes, [])
    ref = reference(token_bytes)
    assert_same_trie(vocab.trie, ref)
    assert_same_trie(TokenTrie.build(token_bytes), ref)
    assert np.array_equal(vocab.single_byte_tokens, ref.singles)
    assert not vocab.single_byte_tokens.flags.writeable
    assert vocab.token_bytes == tuple(data or None for data in token_bytes)
    assert vocab.max_token_len == len(ref.byte) - 1
    for data in queries:
        assert vocab.is_token(data) == (data in ref.ids), data
        assert vocab.ids_of(data) == ref.ids.get(data, ()), data
        assert vocab.has_extension(data) == (data in ref.extendable), data


# Small alphabets make shared prefixes, prefix-of-another tokens and duplicates common; the
# full byte range covers 0x00 and 0xFF (a zero byte must not end a token early).
_ALPHABETS = st.sampled_from([b"ab", b"a\x00\xff", b"abc\xc3\xa9", bytes(range(256))])


@st.composite
def vocabularies(draw: st.DrawFn) -> tuple[list[bytes | None], list[bytes]]:
    """Random per-id bytes (with None, empty, repeated and multi-byte entries) and queries:
    every token, every prefix and one-byte extension of it, and random strings."""
    alphabet = draw(_ALPHABETS)
    piece = st.binary(min_size=1, max_size=7).map(
        lambda raw: bytes(alphabet[b % len(alphabet)] for b in raw))
    entries = draw(st.lists(st.one_of(piece, piece, piece, st.sampled_from([None, b""])),
                            max_size=40))
    repeats = draw(st.lists(st.integers(0, 1000), max_size=6))
    tokens: list[bytes | None] = list(entries)
    for choice in repeats:
        if tokens:
            tokens.insert(choice % (len(tokens) + 1), tokens[choice % len(tokens)])
    words = [data for data in tokens if data]
    queries = [b"", *draw(st.lists(piece, max_size=10))]
    queries += [w[:i] for w in words for i in range(len(w) + 1)]
    queries += [w + bytes([alphabet[0]]) for w in words]
    return tokens, queries


@settings(max_examples=300, deadline=None)
@given(vocabularies())
def test_build_matches_the_reference(case: tuple[list[bytes | None], list[bytes]]) -> None:
    tokens, queries = case
    assert_same_vocabulary(tokens, queries)


@pytest.mark.parametrize("tokens", [
    [],
    [None, b""],
    [b"a"],
    [b"\x00", b"\x00\x00", b"\x00"],
    [b"abc", b"ab", b"a", b"abd", b"b", b"abc"],
    [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"bc", b"ab", b"\xff\x00"],
])
def test_build_matches_the_reference_on_edge_cases(tokens: list[bytes | None]) -> None:
    queries = [b"", b"a", b"ab", b"abc", b"abcd", b"\x00", b"\x00\x00\x00", b"\xff", b"z"]
    assert_same_vocabulary(tokens, queries + [t for t in tokens if t])


def test_build_matches_the_reference_on_smollm2(smol_vocab: Vocabulary) -> None:
    """The real vocabulary: 49,135 ordinary tokens up to 81 bytes, 100,297 trie nodes."""
    tokens = list(smol_vocab.token_bytes)
    words = [data for data in tokens if data]
    prefixes = sorted({w[:i] for w in words[::7] for i in range(len(w))})
    assert_same_vocabulary(tokens, [*words, *prefixes, *(w + b"\x00" for w in words[::5])])


def test_duplicate_ids_are_listed_in_id_order() -> None:
    vocab = Vocabulary.from_token_bytes([b"x", b"y", b"x", None, b"x", b"y"], [3])
    assert vocab.ids_of(b"x") == (0, 2, 4)
    assert vocab.ids_of(b"y") == (1, 5)
    assert vocab.trie.duplicates == ((2, 0), (4, 0), (5, 1))
    assert vocab.ids_of(b"z") == ()
