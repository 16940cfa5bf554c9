"""Sampler: greedy is argmax, masks are obeyed, seeds reproduce, filters narrow the choice."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from qrun.runtime.sampler import (
    SamplingParams,
    draw,
    log_normalizers,
    log_softmax,
    new_generator,
    reshape,
    sample,
)


def logits() -> npt.NDArray[np.float32]:
    return np.array([1.0, 3.0, 2.0, 0.5], dtype=np.float32)


def reference_log_softmax(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # Written out in float64 here, so the runtime's float32 log_softmax is checked against it.
    finite = values[np.isfinite(values)]
    return values - (finite.max() + math.log(float(np.exp(finite - finite.max()).sum())))


def test_greedy_takes_the_argmax_and_reports_its_logprob() -> None:
    token, logprob = sample(logits(), None, SamplingParams(), None)
    assert token == 1
    assert math.isclose(logprob, float(reference_log_softmax(logits().astype(float))[1]),
                        rel_tol=1e-6)


def test_greedy_takes_the_first_index_on_ties() -> None:
    tied = np.array([0.0, 2.0, 1.0, 2.0], dtype=np.float32)
    assert sample(tied, None, SamplingParams(), None)[0] == 1
    assert sample(tied, np.array([True, False, True, True]), SamplingParams(), None)[0] == 3


def test_mask_excludes_tokens_and_renormalises() -> None:
    mask = np.array([True, False, True, False])
    token, logprob = sample(logits(), mask, SamplingParams(), None)
    assert token == 2
    expected = 2.0 - math.log(math.exp(1.0) + math.exp(2.0))
    assert math.isclose(logprob, expected, rel_tol=1e-6)


def test_sampling_is_reproducible_with_a_seed_and_respects_the_mask() -> None:
    params = SamplingParams(temperature=1.0)
    mask = np.array([True, True, True, False])
    draws = [sample(logits(), mask, params, new_generator(7))[0] for _ in range(3)]
    assert len(set(draws)) == 1
    many = [sample(logits(), mask, params, new_generator(s))[0] for s in range(200)]
    assert 3 not in many
    assert set(many) == {0, 1, 2}


def test_a_shared_generator_moves_on_between_draws() -> None:
    # A run's holes share one generator (docs/language.md §14.8): successive draws differ.
    params = SamplingParams(temperature=1.0)
    generator = new_generator(5)
    draws = [sample(logits(), None, params, generator)[0] for _ in range(40)]
    assert len(set(draws)) > 1
    again = new_generator(5)
    assert draws == [sample(logits(), None, params, again)[0] for _ in range(40)]


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    for params in (SamplingParams(temperature=2.0, top_k=1), SamplingParams(1.0, top_p=0.01)):
        draws = {sample(logits(), None, params, new_generator(s))[0] for s in range(50)}
        assert draws == {1}


def test_top_k_and_top_p_keep_exactly_the_most_likely_tokens() -> None:
    # probabilities at T=1: [0.086, 0.636, 0.234, 0.052]
    top2 = {sample(logits(), None, SamplingParams(1.0, top_k=2), new_generator(s))[0]
            for s in range(300)}
    assert top2 == {1, 2}
    # top_p 0.8: 0.636 < 0.8, so the second most likely (0.234) is kept too, and no other.
    nucleus = {sample(logits(), None, SamplingParams(1.0, top_p=0.8), new_generator(s))[0]
               for s in range(300)}
    assert nucleus == {1, 2}


def test_masking_does_not_distort_sampling_among_allowed_tokens() -> None:
    # A seeded statistical test (outlines-core's test_statistical.py): the frequencies of the
    # allowed tokens must follow the model's distribution
    # renormalised over them, at temperatures 1 and 0.7 (the scaling applies before the mask
    # renormalises). Pearson's chi-square with 5 degrees of freedom: 99.9 % quantile 20.5.
    generator = new_generator(1234)
    vocab = 4_096
    base = (generator.standard_normal(vocab) * 3).astype(np.float32)
    allowed = np.array([5, 77, 1_024, 2_000, 3_333, 4_095])
    mask = np.zeros(vocab, dtype=np.bool_)
    mask[allowed] = True
    draws = 4_000
    for temperature in (1.0, 0.7):
        params = SamplingParams(temperature=temperature)
        counts = np.zeros(vocab)
        for _ in range(draws):
            token, _ = sample(base, mask, params, generator)
            counts[token] += 1
        assert counts[~mask].sum() == 0
        scaled = base[allowed].astype(np.float64) / temperature
        expected = np.exp(scaled - scaled.max()) / np.exp(scaled - scaled.max()).sum() * draws
        chi2 = float(((counts[allowed] - expected) ** 2 / expected).sum())
        assert chi2 < 20.5, (temperature, chi2, counts[allowed].tolist(), expected.tolist())


def test_the_reported_logprob_is_the_masked_models_at_temperature_one() -> None:
    # Whatever the sampling temperature, a record's log-probability is the token's under the
    # masked distribution at temperature 1 (what a caller compares across runs).
    mask = np.array([True, True, False, True])
    token, logprob = sample(logits(), mask, SamplingParams(temperature=0.5), new_generator(3))
    masked = np.where(mask, logits().astype(np.float64), -np.inf)
    assert math.isclose(logprob, float(reference_log_softmax(masked)[token]), rel_tol=1e-6)


def test_draw_never_picks_a_zero_weight() -> None:
    weights = np.array([0.0, 1e-300, 0.0, 1.0, 0.0])
    picks = {draw(weights, new_generator(s)) for s in range(500)}
    assert picks <= {1, 3} and 3 in picks


def test_log_softmax_of_rows_matches_the_reference() -> None:
    rows = new_generator(0).standard_normal((3, 50)).astype(np.float32) * 4
    np.testing.assert_allclose(log_softmax(rows),
                               np.stack([reference_log_softmax(r.astype(float)) for r in rows]),
                               atol=1e-5)
    assert log_softmax(rows).dtype == np.float32


def test_log_normalizers_are_what_a_logit_less_is_its_log_probability() -> None:
    rows = new_generator(1).standard_normal((7, 50)).astype(np.float32) * 4
    rows[2, :10] = -np.inf  # masked entries, as a constrained row has them
    for block in (1, 3, 64):  # rows taken a few at a time or all at once
        norms = log_normalizers(rows, block)
        assert norms.shape == (7,)
        np.testing.assert_allclose(
            rows - norms[:, None], np.stack([reference_log_softmax(r.astype(float))
                                             for r in rows]), atol=1e-5)


# ---- penalties, logit_bias, min_p (docs/language.md §14.8) ----------------------------------


def test_logit_bias_moves_greedy_and_the_reported_logprob_stays_the_models() -> None:
    params = SamplingParams(logit_bias=((3, 3.0),))  # 0.5 + 3 beats 3.0
    token, logprob = sample(logits(), None, params, None)
    assert token == 3
    raw = reference_log_softmax(logits().astype(float))
    assert math.isclose(logprob, float(raw[3]), rel_tol=1e-6)


def test_logit_bias_never_passes_the_mask() -> None:
    mask = np.array([True, False, True, False])
    params = SamplingParams(logit_bias=((1, 100.0), (3, 100.0), (2, -100.0)))
    assert sample(logits(), mask, params, None)[0] == 0
    for seed in range(50):  # sampled too: only allowed tokens, however biased
        token, _ = sample(logits(), mask, SamplingParams(1.0, logit_bias=((2, -100.0),)),
                          new_generator(seed))
        assert token == 0


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    values = np.array([4.0, -1.0, 3.0, 0.0], dtype=np.float32)
    shaped = reshape(values, SamplingParams(repetition_penalty=2.0), (), [0, 1, 0])
    assert shaped.tolist() == [2.0, -2.0, 3.0, 0.0]
    assert sample(values, None, SamplingParams(repetition_penalty=2.0), None, (), [0])[0] == 2


def test_frequency_counts_each_time_presence_once_and_only_the_holes_tokens() -> None:
    values = np.zeros(4, dtype=np.float32)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    shaped = reshape(values, params, output=[1, 1, 1, 2], context=[0, 0, 1, 1, 1, 2])
    assert shaped.tolist() == [0.0, -1.75, -0.75, 0.0]
    # A negative penalty favours what the hole wrote: greedy then repeats it.
    favour = SamplingParams(frequency_penalty=-2.0)
    assert sample(logits(), None, favour, None, output=[3])[0] == 1  # 0.5 + 2 < 3
    assert sample(logits(), None, favour, None, output=[3, 3])[0] == 3  # 0.5 + 4 > 3


def test_min_p_drops_tokens_under_its_share_of_the_likeliest() -> None:
    # Probabilities at temperature 1 relative to the top (3.0): e^-2, 1, e^-1, e^-2.5.
    params = SamplingParams(1.0, min_p=0.3)  # keeps 1 (1.0) and 2 (0.37)
    seen = {sample(logits(), None, params, new_generator(seed))[0] for seed in range(200)}
    assert seen == {1, 2}
    without = {sample(logits(), None, SamplingParams(1.0), new_generator(seed))[0]
               for seed in range(200)}
    assert without == {0, 1, 2, 3}


def test_neutral_values_change_nothing_and_are_not_sent_to_a_server() -> None:
    assert not SamplingParams(repetition_penalty=1.0).reshapes
    assert SamplingParams().server_fields() == {}
    fields = SamplingParams(min_p=0.1, presence_penalty=1.0, frequency_penalty=-1.0,
                            repetition_penalty=1.2, logit_bias=((7, -100.0),)).server_fields()
    assert fields == {"min_p": 0.1, "presence_penalty": 1.0, "frequency_penalty": -1.0,
                      "repetition_penalty": 1.2, "logit_bias": {"7": -100.0}}
