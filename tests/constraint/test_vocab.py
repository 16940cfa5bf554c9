"""Vocabulary (qrun/constraint/vocab.py): extension queries and the token trie. Decoding a
Hugging Face tokenizer's pieces into bytes is tests/backends/test_hf_vocabulary.py."""

from __future__ import annotations

from qrun.constraint.vocab import TokenTrie, Vocabulary, token_lengths


def test_has_extension(smol_vocab: Vocabulary) -> None:
    assert smol_vocab.has_extension(b" th")
    assert smol_vocab.has_extension(b"")
    assert not smol_vocab.has_extension(b"\x00\x00\x00")
    longest = max((b for b in smol_vocab.token_bytes if b), key=len)
    assert not smol_vocab.has_extension(longest)


def test_trie_layout() -> None:
    trie = TokenTrie.build([b"a", b"ab", b"b", None, b"ab", b"abc", b""])
    assert trie.max_len == 3
    assert trie.duplicates == ((4, 1),)
    assert list(trie.byte[1]) == [ord("a"), ord("b")]
    assert list(trie.token_at[1]) == [0, 2]
    assert list(trie.child_count[1]) == [1, 0]  # 'a' has child 'ab'; 'b' none
    assert list(trie.token_at[3]) == [5]


def test_extensions_walk_only_the_allowed_bytes(smol_vocab: Vocabulary) -> None:
    # The walk visits the prefixes made of allowed bytes; it finds what a scan of every
    # token finds (runtime/hole.py: the tokens that hold a hole's next text and then close).
    punctuation = frozenset(b'.,;:!?"()[]{} \n')
    for data, allowed in ((b'"', punctuation), (b" ", frozenset(b" \n\t")), (b".", punctuation),
                          (b"zzqx", punctuation)):
        scanned = sorted(
            token for token, held in enumerate(smol_vocab.token_bytes)
            if held is not None and len(held) > len(data) and held.startswith(data)
            and all(byte in allowed for byte in held[len(data):]))
        assert sorted(smol_vocab.extensions(data, allowed)) == scanned
    assert len(smol_vocab.extensions(b'"', punctuation)) > 10


def test_token_lengths_are_built_once_per_vocabulary() -> None:
    vocab = Vocabulary.from_token_bytes([b"a", b"bc", None, b"\xe2\x82", b"def"], [2])
    lengths = token_lengths(vocab)
    assert lengths.tolist() == [1, 2, 0, 2, 3]
    assert token_lengths(vocab) is lengths  # cached: a particles hole does not rebuild it
    assert not lengths.flags.writeable  # shared, so nobody may write it
