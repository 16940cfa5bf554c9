"""sampler="exact" (runtime/exact.py, docs/language.md §14.8): a constrained hole's value drawn
from the model's own conditional over the constraint's language. The probabilities are checked
against a brute force on the tiny model: every tokenization of every value, each scored by one
plain forward of the HF model (no qrun code), summed per value and normalised."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import GenerationError, TemplateError
from qrun.runtime import exact

PROMPT = "The animal is a"


def tokenizations(model: TransformersBackend, data: bytes) -> Iterator[list[int]]:
    """Every token sequence whose bytes are `data` (ordinary tokens only)."""
    vocab = model.vocabulary
    if not data:
        yield []
        return
    for cut in range(1, min(len(data), vocab.max_token_len) + 1):
        for token in vocab.ids_of(data[:cut]):
            for rest in tokenizations(model, data[cut:]):
                yield [token, *rest]


def sequence_logprob(model: TransformersBackend, context: list[int], tokens: list[int],
                     end: tuple[int, ...] = ()) -> float:
    """log P(tokens | context) from one forward of the HF model, plus the log of the mass of
    `end` tokens after them when given."""
    ids = torch.tensor([context + tokens])
    with torch.no_grad():
        logits = model.model(ids).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    total = sum(float(logprobs[len(context) + k - 1, t]) for k, t in enumerate(tokens))
    if end:
        total += float(torch.logsumexp(logprobs[len(context) + len(tokens) - 1, list(end)], 0))
    return total


def brute_force(model: TransformersBackend, context: list[int], values: dict[str, bool],
                canonical: bool = False) -> dict[str, float]:
    """Each value's conditional probability; `values` says of each whether the language goes
    on past it (then it pays the model's EOS mass)."""
    eos = tuple(sorted(model.eos_token_ids))
    mass = {}
    for value, goes_on in values.items():
        rows = ([model.encode(value)] if canonical
                else list(tokenizations(model, value.encode())))
        mass[value] = sum(math.exp(sequence_logprob(model, context, row, eos if goes_on else ()))
                          for row in rows)
    total = sum(mass.values())
    return {value: m / total for value, m in mass.items()}


def run(model: Any, template: str, **options: Any) -> qrun.Result:
    return qrun.Query(template).run(model=model, options=qrun.RunOptions(**options))


def test_every_tokenization_is_scored_and_an_open_value_pays_its_end(
        tiny: TransformersBackend) -> None:
    # " cat" may go on to " cats": ending at " cat" costs the model's EOS mass there.
    result = run(tiny, PROMPT + '{{ gen x regex=" (cat|dog|bird)s?" sampler="exact" heal=false }}')
    record = result.holes["x"]
    context = result.token_ids[: record.start]
    expected = brute_force(tiny, context, {f" {a}{s}": not s for a in ("cat", "dog", "bird")
                                           for s in ("", "s")})
    assert record.value_probs is not None
    assert set(record.value_probs) == set(expected)
    for value, p in expected.items():
        assert record.value_probs[value] == pytest.approx(p, abs=1e-4)
    # More than one tokenization per value was walked, or this test would check nothing new.
    assert sum(1 for _ in tokenizations(tiny, b" birds")) > 1


def test_past_the_tree_limit_each_value_is_scored_in_its_canonical_tokenization(
        tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact, "TREE_LIMIT", 3)
    result = run(tiny, PROMPT + '{{ gen x regex=" (cat|dog|bird)s?" sampler="exact" heal=false }}')
    record = result.holes["x"]
    context = result.token_ids[: record.start]
    expected = brute_force(tiny, context, {f" {a}{s}": not s for a in ("cat", "dog", "bird")
                                           for s in ("", "s")}, canonical=True)
    assert record.value_probs is not None
    for value, p in expected.items():
        assert record.value_probs[value] == pytest.approx(p, abs=1e-4)


def test_draws_follow_the_conditional_and_greedy_takes_the_likeliest(
        tiny: TransformersBackend) -> None:
    query = qrun.Query(PROMPT + '{{ gen x regex=" (cat|dog|bird)" sampler="exact" }}.')
    greedy = query.run(model=tiny)
    probs = greedy.holes["x"].value_probs
    assert probs is not None
    assert greedy["x"] == max(probs, key=probs.__getitem__)
    draws = 400
    runs = query.run_many([{}] * draws, model=tiny, temperature=1.0, seed=7)
    counts = collections.Counter(r["x"] for r in runs)  # type: ignore[index]
    distance = 0.5 * sum(abs(counts[v] / draws - p) for v, p in probs.items())
    assert distance < 0.08, (counts, probs)
    # The same seed, the same draws.
    again = query.run_many([{}] * 20, model=tiny, temperature=1.0, seed=7)
    assert [r["x"] for r in again] == [r["x"] for r in runs[:20]]  # type: ignore[index]


def test_the_value_stays_in_the_context_and_the_run_goes_on(tiny: TransformersBackend) -> None:
    result = run(tiny, PROMPT + '{{ gen x regex=" (cat|dog)" sampler="exact" }} and a'
                 '{{ gen y regex=" (cat|dog)" }}.')
    x = result.holes["x"]
    assert result.text == f"{PROMPT}{result['x']} and a{result['y']}."
    assert result.token_ids[x.start : x.start + len(x.token_ids)] == x.token_ids
    assert x.finish == "match"
    # Its log-probabilities are the model's own, summing to the chosen spelling's.
    context = result.token_ids[: x.start]
    assert sum(x.logprobs) == pytest.approx(  # type: ignore[arg-type]
        sequence_logprob(tiny, context, x.token_ids), abs=1e-4)


def test_json_and_grammar_holes(tiny: TransformersBackend) -> None:
    schema = {"type": "string", "enum": ["red", "green", "blue"]}
    result = qrun.Query('Colour: {{ gen c json=schema sampler="exact" }}').run(
        model=tiny, schema=schema)
    probs = result.holes["c"].value_probs
    assert probs is not None and set(probs) == {'"red"', '"green"', '"blue"'}
    assert result["c"] in ("red", "green", "blue")
    assert sum(probs.values()) == pytest.approx(1.0)
    grammar = 'start: "yes" | "no" | "maybe"'
    result = qrun.Query('Answer: {{ gen a grammar=g sampler="exact" }}').run(model=tiny,
                                                                           g=grammar)
    assert set(result.holes["a"].value_probs or {}) == {"yes", "no", "maybe"}


def test_a_hole_with_n_draws_each_branch_from_the_conditional(tiny: TransformersBackend
                                                              ) -> None:
    result = run(tiny, PROMPT + '{{ gen x regex=" (cat|dog|bird)" sampler="exact" n=3 }}',
                 temperature=1.0, seed=1)
    assert len(result["x"]) == 3 and set(result["x"]) <= {" cat", " dog", " bird"}


@pytest.mark.parametrize(("hole", "message"), [
    ('{{ gen x sampler="exact" }}', "needs a constraint"),
    ('{{ gen x regex="a|b" stop="." sampler="exact" }}', "cannot be used with stop="),
    ('{{ gen x regex="a|b" min_p=0.1 sampler="exact" }}', "cannot be used with min_p="),
    ('{{ gen x regex="a|b" sampler="smart" }}', 'sampler must be "mask", "exact" or "smc"'),
])
def test_what_exact_refuses_at_compile_time(hole: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message) as caught:
        qrun.Query("Hi " + hole)
    assert caught.value.span.line == 1


def test_a_computed_sampler_is_held_to_the_same_rules(tiny: TransformersBackend) -> None:
    with pytest.raises(qrun.errors.EvaluationError, match="cannot be used with stop="):
        qrun.Query('Hi {{ gen x regex="a|b" stop="." sampler=s }}').run(model=tiny, s="exact")


def test_a_language_too_large_is_an_error_at_the_hole(tiny: TransformersBackend) -> None:
    with pytest.raises(GenerationError, match="too large to score whole") as caught:
        qrun.Query('Hi {{ gen x regex="[a-z]{1,4}" sampler="exact" }}').run(model=tiny)
    assert (caught.value.span.line, caught.value.span.column) == (1, 4)
    assert 'sampler="mask" on the hole' in caught.value.message
    # In a particles block a hole may not name sampler="mask": the advice says what it may.
    block = qrun.Query('Hi {% particles 2 %}{{ gen x regex="[a-z]{1,4}" }}{% endparticles %}')
    with pytest.raises(GenerationError, match="too large to score whole") as caught:
        block.run(model=tiny, sampler="exact")
    assert 'sampler="mask"' not in caught.value.message
    assert "name no sampler on the hole and give the run none" in caught.value.message


def test_templates_without_it_are_unchanged(tiny: TransformersBackend) -> None:
    template = PROMPT + '{{ gen x regex=" (cat|dog|bird)" }}'
    masked = qrun.Query(template).run(model=tiny, temperature=1.0, seed=3)
    assert masked.holes["x"].value_probs is None
    explicit = qrun.Query(template.replace("}}", ' sampler="mask" }}')).run(
        model=tiny, temperature=1.0, seed=3)
    assert explicit.holes["x"].token_ids == masked.holes["x"].token_ids
