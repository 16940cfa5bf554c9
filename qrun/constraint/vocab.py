"""The byte view of a tokenizer's vocabulary, built once per tokenizer: what bytes each token id
stands for, plus the level-ordered token trie that regex_index.py walks through a DFA in numpy."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["TokenTrie", "Vocabulary", "VocabularyError"]

class VocabularyError(ValueError):
    """The tokenizer's token strings cannot be mapped to bytes (unsupported tokenizer kind)."""


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
        return _trie_of(_Distinct.of(token_bytes))


@dataclass(frozen=True, slots=True)
class _Distinct:
    """The distinct non-empty byte strings of a vocabulary: `first_id` maps each to its lowest
    token id, `duplicates` lists every other id as (id, first id) in id order, and `ordered`
    holds them sorted bytewise (the order the trie levels and has_extension rely on)."""

    first_id: dict[bytes, int]
    duplicates: tuple[tuple[int, int], ...]
    ordered: tuple[bytes, ...]

    @staticmethod
    def of(token_bytes: Sequence[bytes | None]) -> _Distinct:
        first_id: dict[bytes, int] = {}
        duplicates: list[tuple[int, int]] = []
        for token_id, data in enumerate(token_bytes):
            if not data:
                continue
            first = first_id.setdefault(data, token_id)
            if first != token_id:
                duplicates.append((token_id, first))
        return _Distinct(first_id, tuple(duplicates), tuple(sorted(first_id)))


def _trie_of(distinct: _Distinct) -> TokenTrie:
    """The level-ordered trie, built with numpy from the bytewise-sorted tokens (~50 ms for
    SmolLM2's 49k tokens; the former per-prefix Python loops took ~0.3 s at every start).

    Token i of the sorted list shares its first lcp[i] bytes with token i-1, so it adds exactly
    the nodes of its prefixes longer than that; the shorter ones belong to an earlier token.
    Within a level, those nodes listed by token index are in bytewise order, which is the
    required (parent, byte) order because the level above is in bytewise order too. A node's
    parent is the node of the level above added by the last token at or before its own: the
    tokens starting with a given prefix are contiguous in sorted order, and the first of them
    adds that prefix's node.
    """
    ordered = distinct.ordered
    lens = np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered))
    ids = np.fromiter(map(distinct.first_id.__getitem__, ordered), dtype=np.int64,
                      count=len(ordered))
    flat = np.frombuffer(b"".join(ordered), dtype=np.uint8)
    starts = np.cumsum(lens) - lens
    lcp = _common_prefix_lengths(flat, starts, lens)
    node_token, offset = _ranges(lens - lcp)
    node_depth = lcp[node_token] + offset + 1
    order = np.argsort(node_depth, kind="stable")  # by depth, then token index
    node_token, node_depth = node_token[order], node_depth[order]
    max_len = int(lens.max(initial=0))
    bounds = np.searchsorted(node_depth, np.arange(1, max_len + 2))
    bytes_out: list[npt.NDArray[np.uint8]] = [np.zeros(0, dtype=np.uint8)]
    tokens_out: list[npt.NDArray[np.int64]] = [np.full(1, -1, dtype=np.int64)]
    starts_out: list[npt.NDArray[np.int64]] = []
    counts_out: list[npt.NDArray[np.int64]] = []
    above = np.zeros(1, dtype=np.int64)  # the sorted token that added each node above; root: 0
    for depth in range(1, max_len + 1):
        level = node_token[bounds[depth - 1]:bounds[depth]]
        parents = np.searchsorted(above, level, side="right") - 1
        count = np.bincount(parents, minlength=len(above)).astype(np.int64, copy=False)
        counts_out.append(count)
        starts_out.append(np.cumsum(count) - count)
        bytes_out.append(flat[starts[level] + depth - 1])
        tokens_out.append(np.where(lens[level] == depth, ids[level], -1))
        above = level
    return _frozen_trie(bytes_out, starts_out, counts_out, tokens_out, distinct.duplicates)


def _common_prefix_lengths(
    flat: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """lcp[i]: how many leading bytes sorted token i shares with token i-1 (lcp[0] = 0), from
    the tokens concatenated in `flat`. Each pair compares its min(len) leading bytes, so the
    work is linear in the vocabulary's total bytes."""
    lcp = np.zeros(len(lens), dtype=np.int64)
    if len(lens) < 2:
        return lcp
    width = np.minimum(lens[:-1], lens[1:])  # >= 1: no token is empty
    pair, offset = _ranges(width)
    differs = flat[starts[:-1][pair] + offset] != flat[starts[1:][pair] + offset]
    # The first differing offset, or the width when one token starts the other.
    lcp[1:] = np.minimum.reduceat(np.where(differs, offset, width[pair]), np.cumsum(width) - width)
    return lcp


def _ranges(
    lengths: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """For consecutive ranges of these lengths laid end to end: each element's range index and
    its offset inside that range."""
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    offset = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths,
                                                               lengths)
    return owner, offset


def _frozen_trie(
    bytes_out: list[npt.NDArray[np.uint8]],
    starts: list[npt.NDArray[np.int64]],
    counts: list[npt.NDArray[np.int64]],
    tokens_out: list[npt.NDArray[np.int64]],
    duplicates: tuple[tuple[int, int], ...],
) -> TokenTrie:
    """The trie with its level arrays made read-only (it is shared by every index built on the
    vocabulary); appends the last level's child ranges, which are empty."""
    empty = np.zeros(0, dtype=np.int64)
    starts.append(empty)
    counts.append(empty)
    for group in (bytes_out, tokens_out, starts, counts):
        for array in group:
            array.flags.writeable = False
    return TokenTrie(
        tuple(bytes_out), tuple(starts), tuple(counts), tuple(tokens_out), duplicates
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
    Identity-compared (eq=False): build one per tokenizer (a Hugging Face tokenizer's:
        qrun/backends/hf_tokenizer.py vocabulary_of).
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: tuple[int, ...]
    trie: TokenTrie
    single_byte_tokens: npt.NDArray[np.bool_]
    _first_id: Mapping[bytes, int]  # each distinct byte string's lowest id
    _more_ids: Mapping[int, tuple[int, ...]]  # first id -> the later ids with the same bytes
    _sorted: tuple[bytes, ...]  # the distinct byte strings, bytewise (for has_extension)

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
        return data in self._first_id

    def ids_of(self, data: bytes) -> tuple[int, ...]:
        """Every token id whose bytes are exactly `data` (several when duplicated)."""
        first = self._first_id.get(data)
        if first is None:
            return ()
        return (first, *self._more_ids.get(first, ()))

    def has_extension(self, data: bytes) -> bool:
        """Whether some token's bytes properly start with `data` (token healing asks this of the
        last token before a hole: if true, the hole could have continued it)."""
        # The tokens that start with `data` sort right after it, so the first token sorting
        # above `data` is a proper extension if any token is.
        after = bisect.bisect_right(self._sorted, data)
        return after < len(self._sorted) and self._sorted[after].startswith(data)

    def extensions(self, data: bytes, allowed: frozenset[int]) -> tuple[int, ...]:
        """Every token id whose bytes are `data` and then one or more bytes of `allowed`
        (`",` and `".` for `"` with punctuation allowed). Only such prefixes are visited (a
        bisect each), not every token that starts with `data` (32,000 for " " on SmolLM2)."""
        found: list[int] = []
        pending = [data] if self.has_extension(data) else []
        while pending:
            prefix = pending.pop()
            for byte in allowed:
                longer = prefix + bytes((byte,))
                if self._starts_a_token(longer):
                    found.extend(self.ids_of(longer))
                    if self.has_extension(longer):
                        pending.append(longer)
        return tuple(found)

    def _starts_a_token(self, data: bytes) -> bool:
        """Whether some token's bytes start with `data` (or are `data`)."""
        at = bisect.bisect_left(self._sorted, data)
        return at < len(self._sorted) and self._sorted[at].startswith(data)

    @staticmethod
    def from_token_bytes(
        token_bytes: Sequence[bytes | None], eos_token_ids: Sequence[int]
    ) -> Vocabulary:
        """Build from explicit per-id bytes (tests, non-HF tokenizers)."""
        cleaned = tuple(data if data else None for data in token_bytes)
        for eos in eos_token_ids:
            if not 0 <= eos < len(cleaned):
                raise VocabularyError(f"eos id {eos} is outside the vocabulary (0..{len(cleaned)})")
        distinct = _Distinct.of(cleaned)
        trie = _trie_of(distinct)
        singles = np.zeros(256, dtype=np.bool_)
        if trie.max_len:  # the one-byte tokens end at level 1
            singles[trie.byte[1][trie.token_at[1] >= 0]] = True
        singles.flags.writeable = False
        more_ids: dict[int, tuple[int, ...]] = {}
        for token_id, first in distinct.duplicates:
            more_ids[first] = (*more_ids.get(first, ()), token_id)
        return Vocabulary(cleaned, tuple(eos_token_ids), trie, singles, distinct.first_id,
                          more_ids, distinct.ordered)


@functools.lru_cache(maxsize=8)
def token_lengths(vocab: Vocabulary) -> npt.NDArray[np.int64]:
    """Each token's length in bytes (0 for a token without bytes), read-only. Per vocabulary:
    built from the 49,152 tokens of SmolLM2 it took 4-8 ms, which every sampler="smc" hole
    paid (runtime/particles.py Known), a fifth of a small hole's 0.023 s a sample."""
    lengths = np.array([len(data or b"") for data in vocab.token_bytes], dtype=np.int64)
    lengths.flags.writeable = False
    return lengths


@functools.lru_cache(maxsize=8)
def byte_token_ids(vocab: Vocabulary) -> npt.NDArray[np.int64]:
    """Per byte value, its single-byte token's id (-1 where there is none), read-only. Per
    vocabulary, not per use: the 256 lookups took 1.8 ms (SmolLM2), which a particle paid at
    every step it looked for a small rest (runtime/exact.py _walk_bytes) and were ~5 % of a
    small schema's compile (constraint/grammar_index.py)."""
    tokens = np.array([(vocab.ids_of(bytes([b])) or (-1,))[0] for b in range(256)],
                      dtype=np.int64)
    tokens.flags.writeable = False
    return tokens
