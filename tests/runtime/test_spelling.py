"""Which tokens spell a value as the tokenizer would (runtime/spelling.py): the checks that
particles propose by (runtime/particles.py, docs/language.md §14.8), on SmolLM2's tokenizer."""

from __future__ import annotations

from qrun.backends.transformers import TransformersBackend
from qrun.runtime.spelling import Spellings, reads_as_pair


def one(tiny: TransformersBackend, text: str) -> int:
    ids = tiny.encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_a_pair_is_canonical_where_the_tokenizer_reads_it_so(tiny: TransformersBackend) -> None:
    th, e, cat = one(tiny, " th"), one(tiny, "e"), one(tiny, " cat")
    assert not reads_as_pair(tiny, th, e)  # " the" is one token
    assert reads_as_pair(tiny, th, cat)  # " th cat" is read as " th", " cat"
    spellings = Spellings(tiny)
    assert spellings.canonical_pair(th, cat) and not spellings.canonical_pair(th, e)
    assert spellings.pairs == {(th, cat): True, (th, e): False}
