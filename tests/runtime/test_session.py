"""Session: token ids and KV cache stay in step; every token is fed once; rollback is exact."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from qrun.backends.transformers import TransformersBackend
from qrun.runtime.session import Session


def fresh_logits(backend: TransformersBackend, token_ids: list[int]) -> npt.NDArray[np.float32]:
    session = Session(backend, backend)
    session.append_tokens(token_ids)
    return session.next_logits()


def test_segments_are_fed_once_and_match_one_uncached_forward(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    segments = ["The weather today", " is sunny and", " warm in the city"]
    for segment in segments:
        session.append_text(segment)
        session.next_logits()
    ids = [t for s in segments for t in tiny.encode(s)]
    assert session.token_ids == ids
    assert session.stats.forward_tokens == len(ids)
    assert session.stats.forward_calls == 3
    assert session.cache.length() == len(ids)
    np.testing.assert_allclose(session.next_logits(), fresh_logits(tiny, ids), atol=1e-4, rtol=0)


def test_lazy_feeding_joins_appends_into_one_forward(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    session.append_text("one")
    session.append_text(" two")
    session.append_tokens([tiny.encode(" three")[0]])
    session.next_logits()
    assert session.stats.forward_calls == 1
    assert session.stats.forward_tokens == len(session.token_ids)


def test_rollback_crops_the_cache_exactly(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    session.append_text("A list of colours: red,")
    session.flush()
    base = len(session.token_ids)
    session.append_text(" green, blue")
    session.next_logits()
    session.rollback(base)
    assert session.cache.length() == base
    assert session.stats.rollback_tokens == len(tiny.encode(" green, blue"))
    session.append_text(" yellow")
    session.flush()
    expected = fresh_logits(tiny, session.token_ids)
    np.testing.assert_allclose(session.next_logits(), expected, atol=1e-4, rtol=0)


def test_rollback_of_unfed_tokens_costs_nothing(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    session.append_text("abc")
    session.next_logits()
    fed = session.fed
    session.append_text(" def")
    session.rollback(fed)
    assert session.stats.rollback_tokens == 0
    assert session.token_ids == tiny.encode("abc")


def test_empty_context_gets_the_start_token(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    session.next_logits()
    assert session.token_ids == [tiny.start_token_id]


def test_fork_leaves_the_parent_unchanged(tiny: TransformersBackend) -> None:
    session = Session(tiny, tiny)
    session.append_text("shared prefix text")
    session.next_logits()
    child = session.cache.fork()
    tiny.forward(tiny.encode(" and more"), child)
    assert child.length() == session.cache.length() + len(tiny.encode(" and more"))
    child.crop(2)
    assert child.length() == 2
    assert session.cache.length() == len(session.token_ids)
