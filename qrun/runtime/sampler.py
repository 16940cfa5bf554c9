"""Choosing the next token: pure functions of (logits, mask, SamplingParams, generator)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a hole picks tokens. temperature 0 is greedy (argmax, first index on ties);
    top_p 1.0 and top_k 0 switch those filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        assert self.temperature >= 0.0, "temperature is checked before SamplingParams is built"
        assert 0.0 < self.top_p <= 1.0, "top_p is checked before SamplingParams is built"
        assert self.top_k >= 0, "top_k is checked before SamplingParams is built"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(
    logits: torch.Tensor,
    mask: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, float]:
    """Pick a token id from `logits` ([V] float32), allowed only where `mask` ([V] bool) is
    True. Returns (token id, its log-probability under the masked distribution at
    temperature 1, before top-p/top-k filtering).

    The caller guarantees the mask allows at least one token.
    """
    if params.greedy and logits.device.type == "cpu":
        return _greedy_numpy(logits, mask)
    if mask is not None:
        # Masks are built on the CPU; the copy to the model's device is 49 KB for SmolLM2.
        logits = logits.masked_fill(~mask.to(logits.device), float("-inf"))
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        token = int(torch.argmax(logits).item())
        return token, float(logprobs[token].item())
    scaled = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1])).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    # multinomial on the CPU generator keeps runs reproducible across devices.
    token = int(torch.multinomial(probs.float().cpu(), 1, generator=generator).item())
    return token, float(logprobs[token].item())


def _greedy_numpy(logits: torch.Tensor, mask: torch.Tensor | None) -> tuple[int, float]:
    # Greedy on the CPU in numpy: torch splits 49k-element ops over its intra-op threads, and
    # on a busy 2-core machine one masked argmax + log_softmax took a median 36 ms that way
    # against ~0.1 ms here (bench/RESULTS.md).
    values = logits.detach().numpy()
    if mask is not None:
        values = np.where(mask.numpy(), values, -np.inf)
    token = int(np.argmax(values))
    top = float(values[token])
    logprob = -float(np.log(np.sum(np.exp(values - top))))
    return token, logprob


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = torch.sort(probs, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
    drop = cumulative - sorted_probs >= top_p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum()
