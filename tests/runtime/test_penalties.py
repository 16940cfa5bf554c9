"""Penalties, logit_bias and min_p in runs (docs/language.md §14.8): where they come from (run
option, front matter, hole argument), what history they count, that masks still hold, and that
speculation does not change what they choose. The arithmetic itself: tests/runtime/
test_sampler.py."""

from __future__ import annotations

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import EvaluationError, UsageError

PARENS = 1000  # a token of the tiny model's vocabulary: b"()"


def tokens(model: TransformersBackend, template: str, **options: object) -> list[int]:
    result = qrun.Query(template).run(model=model, options=qrun.RunOptions(**options))
    return list(result.holes["x"].token_ids)


def test_the_tiny_models_token_is_what_the_tests_think(tiny: TransformersBackend) -> None:
    assert tiny.vocabulary.token_bytes[PARENS] == b"()"


def test_logit_bias_from_the_run_from_the_hole_and_the_hole_wins(
        tiny: TransformersBackend) -> None:
    plain = tokens(tiny, "Hi {{ gen x max_tokens=8 }}")
    assert PARENS not in plain
    assert tokens(tiny, "Hi {{ gen x max_tokens=8 }}", logit_bias={PARENS: 100})[1:] == [PARENS] * 7
    # As JSON sends it (string keys), and as a hole argument overriding the run's.
    assert tokens(tiny, 'Hi {{ gen x max_tokens=8 logit_bias={"1000": 100} }}')[1:] == \
        [PARENS] * 7
    assert PARENS not in tokens(tiny, "Hi {{ gen x max_tokens=8 logit_bias={5: 1} }}",
                                logit_bias={PARENS: 100})


def test_frequency_and_presence_count_the_holes_own_tokens(tiny: TransformersBackend) -> None:
    template = "Hi {{ gen x max_tokens=12 }}"
    assert len(set(tokens(tiny, template))) == 12  # greedy, no token twice
    # A negative penalty rewards what the hole wrote: greedy falls into a loop.
    assert len(set(tokens(tiny, template, presence_penalty=-2.0))) <= 8
    assert len(set(tokens(tiny, template, frequency_penalty=-2.0))) <= 8
    # From the front matter too.
    assert len(set(tokens(tiny, "---\npresence_penalty: -2\n---\n" + template))) <= 8


def test_repetition_penalty_counts_the_prompt_and_the_hole(tiny: TransformersBackend) -> None:
    # A bias makes "()" the greedy choice; a strong repetition penalty then allows it once,
    # and not at all where the prompt already has it.
    assert tokens(tiny, "Hi {{ gen x max_tokens=8 }}", logit_bias={PARENS: 20}).count(PARENS) == 7
    once = tokens(tiny, "Hi {{ gen x max_tokens=8 }}", logit_bias={PARENS: 20},
                  repetition_penalty=100.0)
    assert once.count(PARENS) == 1
    assert tiny.encode("Hi()") == [26843, PARENS]
    in_prompt = tokens(tiny, "Hi() {{ gen x max_tokens=8 }}", logit_bias={PARENS: 20},
                       repetition_penalty=100.0)
    assert PARENS not in in_prompt


def test_a_bias_never_passes_the_mask(tiny: TransformersBackend) -> None:
    digits = {tiny.encode(d)[0]: -100.0 for d in "0123456789" if len(tiny.encode(d)) == 1}
    result = qrun.Query('Year: {{ gen x regex="[0-9]{4}" }}').run(
        model=tiny, options=qrun.RunOptions(logit_bias={**digits, PARENS: 100}))
    value = result.vars["x"]
    assert len(value) == 4 and value.isdigit()


def test_speculation_does_not_change_what_penalties_choose(tiny: TransformersBackend) -> None:
    # A loop is what prompt lookup drafts from; each drafted token is still chosen by the
    # sampler with the penalties (runtime/generate.py), so the tokens are the same.
    template = "Hi {{ gen x max_tokens=40 }}"
    results = [qrun.Query(template).run(model=tiny, options=qrun.RunOptions(
        presence_penalty=-2.0, repetition_penalty=1.3, speculate=speculate))
        for speculate in (False, True)]
    assert results[0].holes["x"].token_ids == results[1].holes["x"].token_ids
    assert results[1].stats.forward_calls < results[0].stats.forward_calls


def test_sampled_with_min_p_replays_by_seed(tiny: TransformersBackend) -> None:
    template = "Hi {{ gen x max_tokens=20 }}"
    runs = [tokens(tiny, template, temperature=1.0, min_p=0.2, seed=3) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0] != tokens(tiny, template, temperature=1.0, seed=3)


def test_a_token_past_the_vocabulary_is_refused_where_it_was_given(
        tiny: TransformersBackend) -> None:
    size = tiny.vocabulary.size
    with pytest.raises(UsageError, match=f"logit_bias names token {size}, outside"):
        tokens(tiny, "Hi {{ gen x max_tokens=2 }}", logit_bias={size: 1})
    with pytest.raises(EvaluationError, match="outside the model's vocabulary") as info:
        qrun.Query("Hi {{ gen x max_tokens=2 logit_bias=b }}").run(model=tiny, b={size: 1})
    assert (info.value.span.line, info.value.span.column) == (1, 37)
