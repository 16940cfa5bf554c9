"""Choosing the next token: pure functions of (logits, mask, SamplingParams, generator).

Everything here is numpy on the CPU, whatever the model's device: a backend hands over its
logits as a float32 array (backends/base.py StepModel.forward), so the runtime never needs torch
(`--backend llamacpp` starts without importing it, docs/language.md §18) and sampling is the
same arithmetic on every backend. Randomness comes from numpy's `Generator` (PCG64), seeded per
run or per hole (docs/language.md §14.8)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a hole picks tokens. temperature 0 is greedy (argmax, first index on ties);
    top_p 1.0, top_k 0 and min_p 0 switch those filters off.

    The penalties and logit_bias reshape the logits before the mask and before any choice,
    greedy included, with the meanings OpenAI and vLLM give them (docs/language.md §14.8):
    logit_bias adds to a token's logit; frequency_penalty subtracts, per token, its count
    among the hole's own tokens so far, presence_penalty once if it is among them;
    repetition_penalty divides the positive logits (multiplies the negative ones) of every
    token already in the context, the hole's tokens included (1 is off). min_p drops the
    tokens less likely than min_p times the likeliest allowed one, when sampling."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        assert self.temperature >= 0.0, "temperature is checked before SamplingParams is built"
        assert 0.0 < self.top_p <= 1.0, "top_p is checked before SamplingParams is built"
        assert self.top_k >= 0, "top_k is checked before SamplingParams is built"
        assert 0.0 <= self.min_p <= 1.0, "min_p is checked before SamplingParams is built"
        assert self.repetition_penalty > 0.0, "repetition_penalty is checked before"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def reshapes(self) -> bool:
        """Whether the logits are changed before the choice (a penalty or a bias is set)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0)

    def server_fields(self) -> dict[str, object]:
        """The options beyond temperature, top_p and top_k that are set, by the names of
        vLLM's completions API (which means the same by them): for a hole a server samples."""
        fields: dict[str, object] = {}
        if self.min_p:
            fields["min_p"] = self.min_p
        if self.presence_penalty:
            fields["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            fields["frequency_penalty"] = self.frequency_penalty
        if self.repetition_penalty != 1.0:
            fields["repetition_penalty"] = self.repetition_penalty
        if self.logit_bias:
            fields["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return fields


def new_generator(seed: int | None = None) -> np.random.Generator:
    """The random generator of a run or of a hole with `seed=` (PCG64; fresh when None)."""
    return np.random.default_rng(seed)


def sample(
    logits: npt.NDArray[np.float32],
    mask: npt.NDArray[np.bool_] | None,
    params: SamplingParams,
    generator: np.random.Generator | None,
    output: Sequence[int] = (),
    context: Sequence[int] = (),
) -> tuple[int, float]:
    """Pick a token id from `logits` ([V] float32), allowed only where `mask` ([V] bool) is
    True, after the penalties and the logit bias of `params`: `output` is the hole's tokens so
    far (frequency and presence), `context` every token before this step (repetition).
    Returns (token id, its log-probability under the masked distribution of the model's own
    logits at temperature 1, before penalties, bias and filters: vLLM's "raw" log-probability).

    The caller guarantees the mask allows at least one token.
    """
    values = logits if mask is None else np.where(mask, logits, -np.inf)
    log_norm = log_normalizer(values)
    chosen = values  # what the choice reads: the logits reshaped where params reshape them
    if params.reshapes:
        chosen = reshape(logits, params, output, context)
        if mask is not None:
            chosen = np.where(mask, chosen, -np.inf)
    best = int(np.argmax(chosen))  # the first index on ties
    token = best if params.greedy else _draw(chosen, float(chosen[best]), params,
                                             generator or new_generator())
    return token, float(values[token]) - log_norm


def reshape(logits: npt.NDArray[np.float32], params: SamplingParams, output: Sequence[int],
            context: Sequence[int]) -> npt.NDArray[np.float32]:
    """A copy of `logits` with the logit bias, then the repetition, frequency and presence
    penalties applied (vLLM's order; the token ids were checked against the vocabulary)."""
    shaped = logits.astype(np.float32, copy=True)
    for token, bias in params.logit_bias:
        shaped[token] += bias
    if params.repetition_penalty != 1.0 and len(context):
        seen = np.unique(np.asarray(context, dtype=np.int64))
        row = shaped[seen]
        shaped[seen] = np.where(row > 0, row / params.repetition_penalty,
                                row * params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and len(output):
        tokens, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
        shaped[tokens] -= (params.frequency_penalty * counts
                           + params.presence_penalty).astype(np.float32)
    return shaped


def _draw(values: npt.NDArray[np.float32], top: float, params: SamplingParams,
          generator: np.random.Generator) -> int:
    """Sample from softmax(values / temperature) after the top-k, min-p and top-p filters:
    one uniform draw against the cumulative weights (float64, so 49k small weights sum
    exactly enough that every allowed token keeps its share)."""
    scaled = (values.astype(np.float64) - top) / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled[scaled < kth] = -np.inf
    weights = np.exp(scaled)
    if params.min_p > 0.0:
        # `top` is the largest value, so the likeliest token's weight is exp(0) = 1.
        weights[weights < params.min_p] = 0.0
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


def log_normalizers(logits: npt.NDArray[np.float32], rows: int = 64) -> npt.NDArray[np.float64]:
    """Each row's log(sum(exp(row))) of [n, V] logits: what a logit less is its token's
    log-probability, for a tree's nodes, of which a score reads a few tokens each
    (runtime/select.py tree_logprobs). `rows` at a time, so that the one temporary stays
    small: over 1,000 nodes of SmolLM2's 49,152 tokens 0.24 s where log_softmax, which writes
    every entry, took 0.35 s and two arrays of 200 MB."""
    out = np.empty(len(logits), dtype=np.float64)
    for start in range(0, len(logits), rows):
        block = logits[start : start + rows]
        top = block.max(axis=1, keepdims=True)
        shifted = block - top
        np.exp(shifted, out=shifted)
        out[start : start + rows] = top[:, 0] + np.log(shifted.sum(axis=1, dtype=np.float64))
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
