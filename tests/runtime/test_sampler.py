"""Sampler: greedy is argmax, masks are obeyed, seeds reproduce, filters narrow the choice."""

from __future__ import annotations

import math

import torch

from qrun.runtime.sampler import SamplingParams, sample


def logits() -> torch.Tensor:
    return torch.tensor([1.0, 3.0, 2.0, 0.5])


def test_greedy_takes_the_argmax_and_reports_its_logprob() -> None:
    token, logprob = sample(logits(), None, SamplingParams(), None)
    assert token == 1
    assert math.isclose(logprob, float(torch.log_softmax(logits(), -1)[1]), rel_tol=1e-6)


def test_mask_excludes_tokens_and_renormalises() -> None:
    mask = torch.tensor([True, False, True, False])
    token, logprob = sample(logits(), mask, SamplingParams(), None)
    assert token == 2
    expected = 2.0 - math.log(math.exp(1.0) + math.exp(2.0))
    assert math.isclose(logprob, expected, rel_tol=1e-6)


def test_sampling_is_reproducible_with_a_seed_and_respects_the_mask() -> None:
    params = SamplingParams(temperature=1.0)
    mask = torch.tensor([True, True, True, False])
    draws = [sample(logits(), mask, params, torch.Generator().manual_seed(7))[0] for _ in range(3)]
    assert len(set(draws)) == 1
    many = [sample(logits(), mask, params, torch.Generator().manual_seed(s))[0] for s in range(200)]
    assert 3 not in many
    assert set(many) == {0, 1, 2}


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    for params in (SamplingParams(temperature=2.0, top_k=1), SamplingParams(1.0, top_p=0.01)):
        draws = {sample(logits(), None, params, torch.Generator().manual_seed(s))[0]
                 for s in range(50)}
        assert draws == {1}


def test_masking_does_not_distort_sampling_among_allowed_tokens() -> None:
    # A seeded statistical test (outlines-core's test_statistical.py): the frequencies of the
    # allowed tokens must follow the model's distribution
    # renormalised over them, at temperatures 1 and 0.7 (the scaling applies before the mask
    # renormalises). Pearson's chi-square with 5 degrees of freedom: 99.9 % quantile 20.5.
    generator = torch.Generator().manual_seed(1234)
    vocab = 4_096
    base = torch.randn(vocab, generator=generator) * 3
    allowed = torch.tensor([5, 77, 1_024, 2_000, 3_333, 4_095])
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[allowed] = True
    draws = 4_000
    for temperature in (1.0, 0.7):
        params = SamplingParams(temperature=temperature)
        counts = torch.zeros(vocab)
        for _ in range(draws):
            token, _ = sample(base, mask, params, generator)
            counts[token] += 1
        assert counts[~mask].sum() == 0
        expected = torch.softmax(base[allowed] / temperature, dim=-1) * draws
        chi2 = float(((counts[allowed] - expected) ** 2 / expected).sum())
        assert chi2 < 20.5, (temperature, chi2, counts[allowed].tolist(), expected.tolist())


def test_the_reported_logprob_is_the_masked_models_at_temperature_one() -> None:
    # Whatever the sampling temperature, a record's log-probability is the token's under the
    # masked distribution at temperature 1 (what a caller compares across runs).
    mask = torch.tensor([True, True, False, True])
    token, logprob = sample(logits(), mask, SamplingParams(temperature=0.5),
                            torch.Generator().manual_seed(3))
    masked = logits().masked_fill(~mask, float("-inf"))
    assert math.isclose(logprob, float(torch.log_softmax(masked, -1)[token]), rel_tol=1e-6)
