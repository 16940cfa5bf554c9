"""A model's tokenizer without its weights (backends/tokenizer_only.py): templates without
holes run on it with the same text and token ids as on the full model, and a hole fails at
its span (runtime/engines.py chooses no hole filler)."""

from __future__ import annotations

import pytest

import qrun
from qrun.backends import load_model
from qrun.backends.tokenizer_only import TokenizerBackend
from qrun.backends.transformers import TransformersBackend
from qrun.errors import GenerationError
from qrun.runtime.engines import choose_engines

NO_HOLES = ("{% system %}Be brief.{% endsystem %}{% user %}Count: "
            "{% for i in range(3) %}{{ i }} {% endfor %}<|im_end|> typed{% enduser %}")


@pytest.fixture(scope="module")
def tokenizer_only(tiny_folder: str) -> TokenizerBackend:
    backend = load_model(tiny_folder, weights=False)
    assert isinstance(backend, TokenizerBackend)
    return backend


def test_it_declares_no_way_to_fill_holes(tokenizer_only: TokenizerBackend) -> None:
    assert tokenizer_only.step_model() is None and tokenizer_only.hole_sampler() is None
    engines = choose_engines(tokenizer_only)
    assert engines.filler is None and engines.model is None and engines.scoring is None


def test_a_template_without_holes_runs_as_on_the_full_model(
    tokenizer_only: TokenizerBackend, tiny: TransformersBackend
) -> None:
    query = qrun.Query(NO_HOLES)
    light, full = query.run(model=tokenizer_only), query.run(model=tiny)
    assert light.text == full.text
    assert light.token_ids == full.token_ids
    assert light.stats.forward_calls == 0 and light.stats.context_tokens == len(full.token_ids)
    assert tokenizer_only.chat_markers("user") == tiny.chat_markers("user")


@pytest.mark.parametrize(
    ("template", "message"),
    [("A: {{ gen a }}", "loaded without weights"),
     ("A: {{ select a options=['x', 'y'] }}", "cannot score select options")],
)
def test_a_hole_fails_at_its_span(
    tokenizer_only: TokenizerBackend, template: str, message: str
) -> None:
    with pytest.raises(GenerationError, match=message) as caught:
        qrun.Query(template).run(model=tokenizer_only)
    assert (caught.value.span.line, caught.value.span.column) == (1, 4)


def test_query_load_skips_the_weights_only_without_holes(tiny_folder: str) -> None:
    assert isinstance(qrun.Query("Hi {{ x }}").load(tiny_folder), TokenizerBackend)
    assert isinstance(qrun.Query("Hi {{ gen x }}").load(tiny_folder), TransformersBackend)
