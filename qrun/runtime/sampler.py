"""Choosing the next token: pure functions of (logits, mask, SamplingParams, generator).

Everything here is numpy on the CPU, whatever the model's device: a backend hands over its
logits as a float32 array (backends/base.py StepModel.forward), so the runtime never needs torch
(`--backend llamacpp` starts without importing it, docs/language.md §18) and sampling is the
same arithmetic on every backend. Randomness comes from numpy's `Generator` (PCG64), seeded per
run or per hole (docs/language.md §14.8)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


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


def new_generator(seed: int | None = None) -> np.random.Generator:
    """The random generator of a run or of a hole with `seed=` (PCG64; fresh when None)."""
    return np.random.default_rng(seed)


def sample(
    logits: npt.NDArray[np.float32],
    mask: npt.NDArray[np.bool_] | None,
    params: SamplingParams,
    generator: np.random.Generator | None,
) -> tuple[int, float]:
    """Pick a token id from `logits` ([V] float32), allowed only where `mask` ([V] bool) is
    True. Returns (token id, its log-probability under the masked distribution at
    temperature 1, before top-p/top-k filtering).

    The caller guarantees the mask allows at least one token.
    """
    values = logits if mask is None else np.where(mask, logits, -np.inf)
    best = int(np.argmax(values))  # the first index on ties
    top = float(values[best])
    log_norm = log_normalizer(values, top)
    if params.greedy:
        return best, top - log_norm
    token = _draw(values, top, params, generator or new_generator())
    return token, float(values[token]) - log_norm


def _draw(values: npt.NDArray[np.float32], top: float, params: SamplingParams,
          generator: np.random.Generator) -> int:
    """Sample from softmax(values / temperature) after the top-k and top-p filters: one
    uniform draw against the cumulative weights (float64, so 49k small weights sum exactly
    enough that every allowed token keeps its share)."""
    scaled = (values.astype(np.float64) - top) / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled[scaled < kth] = -np.inf
    weights = np.exp(scaled)
    if params.top_p < 1.0:
        weights = _top_p_filter(weights / weights.sum(), params.top_p)
    return draw(weights, generator)


def draw(weights: npt.NDArray[np.float64], generator: np.random.Generator) -> int:
    """An index drawn with probability proportional to `weights` (≥ 0, some > 0): one
    uniform draw against the cumulative weights. side="right": a draw never lands on an index
    of weight 0 (its cumulative equals the one before it), so masked and filtered tokens are
    never chosen."""
    cumulative = np.cumsum(weights)
    point = generator.random() * cumulative[-1]
    index = int(np.searchsorted(cumulative, point, side="right"))
    if index == len(cumulative):  # the product rounded up to the total: the last live index
        index = int(np.flatnonzero(weights)[-1])
    return index


def log_normalizer(values: npt.NDArray[np.float32], top: float | None = None) -> float:
    """log(sum(exp(values))) over a [V] row whose masked entries are -inf (`top`: its largest
    value, when the caller has it): what a logit less is the masked log-probability."""
    top = float(values.max()) if top is None else top
    return top + float(np.log(np.sum(np.exp(values - top))))


def log_softmax(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """log_softmax over the last axis ([V] or [rows, V]), float32 like the logits."""
    top = logits.max(axis=-1, keepdims=True)
    shifted = logits - top
    out: npt.NDArray[np.float32] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def _top_p_filter(probs: npt.NDArray[np.float64], top_p: float) -> npt.NDArray[np.float64]:
    # Keep the smallest set of most likely tokens whose mass reaches top_p (always at least
    # the top token); the stable sort keeps ties in id order.
    order = np.argsort(-probs, kind="stable")
    ranked = probs[order]
    drop = np.cumsum(ranked) - ranked >= top_p
    filtered = np.zeros_like(probs)
    filtered[order[~drop]] = ranked[~drop]
    return filtered
