"""Which tokens spell a value as the tokenizer would (runtime/spelling.py): the checks that
particles propose by (runtime/particles.py, docs/language.md §14.8), on SmolLM2's tokenizer."""

from __future__ import annotations

import pytest

import qrun.runtime.spelling as spelling
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.spelling import Spellings, Tokenizations, reads_as_pair, tokenizations_of


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


def test_every_hole_on_a_backend_shares_what_its_tokenizer_said(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pairs and rests one hole's particles asked are answered for the next hole (and
    run) on the backend without the tokenizer: they are facts of the tokenizer alone."""
    th, cat = one(tiny, " th"), one(tiny, " cat")
    rest = " cat sleeps on the big old mat."
    first = Spellings(tiny)
    assert first.canonical_pair(th, cat)
    assert tokenizations_of(tiny).encode(rest) == tuple(tiny.encode(rest))
    calls: list[str] = []
    encode = tiny.encode
    monkeypatch.setattr(tiny, "encode", lambda text, **kw: calls.append(text) or encode(text, **kw))
    second = Spellings(tiny)
    assert second.tokenizations is first.tokenizations
    assert second.canonical_pair(th, cat)
    assert tokenizations_of(tiny).encode(rest) == tuple(encode(rest))
    assert calls == []
    new = " a text only this test asks the table for: 7f3a"
    assert tokenizations_of(tiny).encode(new) == tuple(encode(new))
    assert calls == [new]  # a text not asked before goes to the tokenizer


def test_the_tables_stay_bounded(tiny: TransformersBackend,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spelling, "ENTRIES", 2)
    monkeypatch.setattr(spelling, "TEXT_CHARS", 8)
    tables = Tokenizations(tiny)
    calls: list[str] = []
    encode = tiny.encode
    monkeypatch.setattr(tiny, "encode", lambda text, **kw: calls.append(text) or encode(text, **kw))
    for text in (" a", " b", " c", " a", " a long text", " a long text"):
        assert tables.encode(text) == tuple(encode(text))
    # " a" was dropped for " c" (two entries at most); the long text is never kept
    assert calls == [" a", " b", " c", " a", " a long text", " a long text"]
    assert tables.encode(" c") == tuple(encode(" c")) and calls[-1] == " a long text"


def test_the_tables_do_not_keep_a_backend_alive(tiny: TransformersBackend) -> None:
    """A backend's Tokenizations goes with it: an unloaded model is not held by its table."""
    import gc
    import weakref

    class Backend:  # what a Tokenizations reads of a backend
        vocabulary = tiny.vocabulary

        def encode(self, text: str, *, special: bool = False) -> list[int]:
            return tiny.encode(text, special=special)

    backend = Backend()
    th, cat = one(tiny, " th"), one(tiny, " cat")
    assert tokenizations_of(backend).pair(th, cat)  # type: ignore[arg-type]
    gone = weakref.ref(backend)
    del backend
    gc.collect()
    assert gone() is None
