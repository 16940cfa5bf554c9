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
