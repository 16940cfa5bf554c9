"""The prefix cache: shared prefixes are encoded once, identical runs cost no forward,
eviction keeps the bytes held under the budget, cached logits equal fresh ones."""

from __future__ import annotations

import numpy as np

import qrun
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.transformers import TransformersBackend
from qrun.runtime.session import Session

FEW_SHOT = (
    "Answer with one word.\nQ: Colour of grass?\nA: green\nQ: Colour of snow?\nA: white\n"
    "Q: {{ question }}\nA:{{ gen answer max_tokens=4 stop=\"\\n\" }}\n"
)
# The text every run shares as tokens: the space after "Q:" is read with the question that
# follows it (" Colour"), as the tokenizer reads the whole text (docs/language.md §14.2).
SHARED = FEW_SHOT.split("{{")[0].removesuffix(" ")
QUESTIONS = ["Colour of the sky?", "Colour of coal?", "Colour of blood?", "Colour of sand?"]


def cached(tiny: TransformersBackend, budget: int = 64 << 20) -> TransformersBackend:
    return TransformersBackend(tiny.model, tiny.tokenizer, "tiny-cached",
                               prefix_cache=PrefixCache(budget))


def test_shared_prefix_is_encoded_once_and_results_match(tiny: TransformersBackend) -> None:
    query = qrun.Query(FEW_SHOT)
    plain = [query.run(model=tiny, question=q) for q in QUESTIONS]
    backend = cached(tiny)
    runs = [query.run(model=backend, question=q) for q in QUESTIONS]
    assert [r["answer"] for r in runs] == [r["answer"] for r in plain]
    assert [r.text for r in runs] == [r.text for r in plain]
    prefix_len = len(tiny.encode(SHARED))
    assert runs[0].stats.cached_tokens == 0
    for later, fresh in zip(runs[1:], plain[1:], strict=True):
        assert later.stats.cached_tokens >= prefix_len
        assert later.stats.forward_tokens == fresh.stats.forward_tokens - later.stats.cached_tokens
    total = sum(r.stats.forward_tokens for r in runs)
    assert total <= prefix_len + sum(r.stats.forward_tokens - prefix_len for r in plain)


def test_an_identical_run_costs_no_forward(tiny: TransformersBackend) -> None:
    backend = cached(tiny)
    query = qrun.Query(FEW_SHOT)
    first = query.run(model=backend, question="Colour of the sea?")
    again = query.run(model=backend, question="Colour of the sea?")
    assert again.text == first.text
    assert first.stats.forward_calls > 0
    assert again.stats.forward_calls == 0
    assert again.stats.cached_logits == first.stats.forward_calls


def held_bytes(cache: PrefixCache) -> int:
    """Bytes of the distinct storages of every tensor the cache holds, measured directly."""
    seen: dict[int, int] = {}
    for _, value in cache.entries():
        if isinstance(value, np.ndarray):
            seen[value.ctypes.data] = value.nbytes
        else:
            seen.update(dict(value.storages()))
    return sum(seen.values())


def test_eviction_keeps_the_bytes_held_under_the_budget(tiny: TransformersBackend) -> None:
    budget = 3 << 20  # a few snapshots and logits of the tiny model
    backend = cached(tiny, budget)
    assert backend.prefix_cache is not None
    query = qrun.Query(FEW_SHOT)
    for i in range(12):
        query.run(model=backend, question=f"Colour number {i}?")
        assert held_bytes(backend.prefix_cache) == backend.prefix_cache.nbytes <= budget
    assert len(backend.prefix_cache) > 0
    # The shared prefix was used most recently by every run: it survives eviction.
    r = query.run(model=backend, question="Colour of ink?")
    assert r.stats.cached_tokens >= len(tiny.encode(SHARED))


def test_cached_logits_equal_a_fresh_forward(tiny: TransformersBackend) -> None:
    cache = PrefixCache()
    session = Session(tiny, tiny, prefix_cache=cache)
    session.append_text("The first segment,")
    session.next_logits()
    session.append_text(" and the second one")
    logits = session.next_logits().copy()
    hit = cache.lookup(session.token_ids, 0)
    assert hit.logits is not None and np.array_equal(hit.logits, logits)
    fresh = tiny.forward(session.token_ids, tiny.new_cache())[-1]
    np.testing.assert_allclose(hit.logits, fresh, atol=1e-4, rtol=0)
    # A snapshot at the segment boundary inside the second forward serves a new continuation.
    other = Session(tiny, tiny, prefix_cache=cache)
    other.append_text("The first segment,")
    other.append_text(" but another ending")
    other.next_logits()
    assert other.stats.cached_tokens == len(tiny.encode("The first segment,"))


def test_clear_cache_forgets_everything(tiny: TransformersBackend) -> None:
    backend = cached(tiny)
    qrun.Query(FEW_SHOT).run(model=backend, question="?")
    assert backend.prefix_cache is not None and backend.prefix_cache.nbytes > 0
    backend.clear_cache()
    assert backend.prefix_cache.nbytes == 0 and len(backend.prefix_cache) == 0
    assert qrun.Query(FEW_SHOT).run(model=backend, question="?").stats.cached_tokens == 0


def test_a_document_shared_by_runs_is_computed_once(tiny: TransformersBackend) -> None:
    # One stretch holds the document and the question: a snapshot before each value lets the
    # next run with the same document and another question start after the document.
    backend = cached(tiny)
    query = qrun.Query("Doc: {{ doc }}\nQ: {{ q }}\nA:{{ gen a max_tokens=2 }}")
    doc = "The lighthouse was built in 1887 on the northern cape. " * 8
    query.run(model=backend, doc=doc, q="When was it built?")
    later = query.run(model=backend, doc=doc, q="Where is it?")
    assert later.stats.cached_tokens >= len(tiny.encode(f"Doc: {doc}\nQ:"))


def test_a_prefix_shared_inside_one_stretch_is_computed_once(tiny: TransformersBackend) -> None:
    # A chat request's instruction and its question are one message, one stretch: no
    # snapshot lies between them. The earlier run's snapshot past the point where the two
    # part is cropped to it (a radix cache's sharing), and the answers are a fresh run's.
    backend = cached(tiny)
    query = qrun.Query("User: {{ message }}\nA:{{ gen a max_tokens=3 }}")
    instruction = "Extract the person described here as JSON with name, age and city. "
    first = instruction + "Kofi is a 25-year-old baker who lives in Lagos."
    second = instruction + "Mei is a 31-year-old nurse who lives in Taipei."
    query.run(model=backend, message=first)
    later = query.run(model=backend, message=second)
    fresh = query.run(model=tiny, message=second)
    shared = 0
    for a, b in zip(tiny.encode(f"User: {first}"), tiny.encode(f"User: {second}"), strict=False):
        if a != b:
            break
        shared += 1
    assert shared >= 14
    assert later.stats.cached_tokens == shared
    assert later.text == fresh.text
    assert later.stats.forward_tokens == fresh.stats.forward_tokens - shared


class _Snapshot:
    """A KV cache that only knows its length (what lookup forks and crops)."""

    def __init__(self, positions: int) -> None:
        self.positions = positions

    def length(self) -> int:
        return self.positions

    def crop(self, length: int) -> None:
        assert length <= self.positions
        self.positions = length

    def fork(self) -> _Snapshot:
        return _Snapshot(self.positions)

    def storages(self) -> list[tuple[int, int]]:
        return [(id(self), 8 * self.positions)]


def test_lookup_crops_the_nearest_snapshot_past_the_parting_point() -> None:
    cache = PrefixCache(1 << 20)
    held = _Snapshot(6)
    cache.insert([1, 2, 3, 4, 5, 6], held, None)  # type: ignore[arg-type]
    hit = cache.lookup([1, 2, 3, 9, 9], after=0)
    assert hit.kv_length == 3 and hit.kv is not None and hit.kv.length() == 3
    assert held.positions == 6  # the cached snapshot itself is untouched
    assert cache.lookup([1, 2, 3, 9], after=3).kv is None  # nothing past what is fed
    assert cache.lookup([7, 8], after=0).kv is None  # nothing in common
    # A run whose tokens all lie inside a longer one's, with no logits after them: one
    # position short, so that the caller's forward of the last gives them.
    assert cache.lookup([1, 2, 3], after=0).kv_length == 2
    # An on-path snapshot as deep as the parting point is taken as it is.
    cache.insert([1, 2, 3], _Snapshot(3), None)  # type: ignore[arg-type]
    assert cache.lookup([1, 2, 3, 9], after=0).kv_length == 3
