"""Linear layers on prepacked weights (qrun/backends/packed_linear.py): the same logits as
torch's own layers for every shape of forward the runtime makes, the same output through
qrun, and only where they apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qrun
from qrun.backends.packed_linear import PackedLinear, can_pack, pack_linear_layers
from qrun.backends.tiny import load_tiny
from qrun.backends.transformers import TransformersBackend

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="this torch has no oneDNN")

LAYERS = 2
LINEAR_PER_LAYER = 7  # q, k, v, o, gate, up, down


@pytest.fixture(scope="module")
def pair() -> tuple[TransformersBackend, TransformersBackend]:
    """The same tiny model twice: torch's layers, and packed ones."""
    plain = load_tiny(seed=3, layers=LAYERS)
    packed = load_tiny(seed=3, layers=LAYERS)
    assert pack_linear_layers(packed.model) == LAYERS * LINEAR_PER_LAYER + 1  # + lm_head
    return plain, packed


def test_every_linear_layer_is_replaced(pair: tuple[TransformersBackend, ...]) -> None:
    plain, packed = pair
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.model.modules())
    assert isinstance(packed.model.get_output_embeddings(), PackedLinear)
    assert packed.vocab_size == plain.vocab_size


@pytest.mark.parametrize("new_tokens", [1, 2, 5, 9, 40])
def test_logits_match_torch_layers(pair: tuple[TransformersBackend, ...],
                                   new_tokens: int) -> None:
    """A prefill, then a forward over `new_tokens` more (a decode step, a speculation draft,
    a stretch of fixed text), all positions' logits asked for."""
    plain, packed = pair
    prompt = plain.encode("The packed layers must compute what torch's layers compute.")
    more = plain.encode(" And they do, for any number of new tokens " * 4)[:new_tokens]
    results = []
    for backend in (plain, packed):
        cache = backend.new_cache()
        first = backend.forward(prompt, cache)
        results.append((first, backend.forward(more, cache, logits_for=len(more))))
    (plain_first, plain_more), (packed_first, packed_more) = results
    np.testing.assert_allclose(packed_first, plain_first, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(packed_more, plain_more, atol=1e-4, rtol=1e-4)
    assert np.array_equal(packed_more.argmax(-1), plain_more.argmax(-1))


def test_batched_forwards_match(pair: tuple[TransformersBackend, ...]) -> None:
    plain, packed = pair
    texts = ["a short context", "a somewhat longer context, padded on the left"]
    outputs = []
    for backend in (plain, packed):
        caches = [backend.new_cache() for _ in texts]
        for cache, text in zip(caches, texts, strict=True):
            backend.forward(backend.encode(text), cache)
        items = [(backend.encode(" then"), caches[0]),
                 (backend.encode(" and then more"), caches[1])]
        outputs.append(backend.forward_batch(items, logits_for=1))
    for packed_logits, plain_logits in zip(outputs[1], outputs[0], strict=True):
        np.testing.assert_allclose(packed_logits, plain_logits, atol=1e-4, rtol=1e-4)


def test_a_query_gives_the_same_run(pair: tuple[TransformersBackend, ...]) -> None:
    """Generation, a regex hole (masks, speculation), a select (tree scoring)."""
    plain, packed = pair
    query = qrun.Query(
        'Name: {{ gen name stop="\\n" max_tokens=12 }}\n'
        "Age: {{ gen age regex=INT }}\n"
        'Mood: {{ select mood options=["calm", "cheerful", "curious"] }}\n'
        'Again: {{ gen again stop="\\n" max_tokens=12 }}')
    runs = [query.run(model=backend, temperature=0) for backend in (plain, packed)]
    assert runs[1].text == runs[0].text
    assert runs[1].token_ids == runs[0].token_ids


def test_packing_applies_to_float32_cpu_models_only(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert can_pack(model)
    monkeypatch.setenv("QRUN_PACKED_LINEAR", "0")
    assert not can_pack(model)
    monkeypatch.delenv("QRUN_PACKED_LINEAR")
    assert not can_pack(model.to(torch.bfloat16))
    assert not can_pack(torch.nn.Sequential())  # no parameters: nothing to pack


def test_a_loaded_folder_is_packed_unless_switched_off(
    tiny_folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def linear_kinds(backend: object) -> set[type]:
        assert isinstance(backend, TransformersBackend)
        return {type(m) for m in backend.model.modules()
                if isinstance(m, torch.nn.Linear | PackedLinear)}

    assert linear_kinds(qrun.load_model(tiny_folder, dtype="float32")) == {PackedLinear}
    monkeypatch.setenv("QRUN_PACKED_LINEAR", "0")
    assert linear_kinds(qrun.load_model(tiny_folder, dtype="float32")) == {torch.nn.Linear}
