"""Test doubles shared by the suites: the tiny model steered to write chosen tokens (and
counting its model calls), and a scripted server that samples whole holes. Each wraps the real
adapters, so what they exercise is the runtime's real path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import (
    Capabilities,
    Completion,
    HoleSampler,
    PromptScorer,
    ScoredRows,
)
from qrun.backends.hf_tokenizer import HFTokenizerMixin
from qrun.backends.prefix_cache import PrefixCache
from qrun.backends.transformers import TransformersBackend, TransformersCache

Steer = Callable[[int, npt.NDArray[np.float32]], None]
"""steer(position, logits): change in place the logits [V] that follow the first `position`
tokens of a context."""


class SteeredModel(TransformersBackend):
    """A model whose next-token logits `steer` may change after every forward, recording each
    forward as (the ids the cache then holds, the last position's logits before steering) and
    counting every model call (plain, batched and tree forwards)."""

    def __init__(self, base: TransformersBackend, steer: Steer | None = None,
                 name: str = "steered", prefix_cache: PrefixCache | None = None) -> None:
        super().__init__(base.model, base.tokenizer, name, prefix_cache=prefix_cache)
        self.steer = steer
        self.calls = 0
        self.forwards: list[tuple[list[int], npt.NDArray[np.float32]]] = []
        self._held: dict[int, list[int]] = {}

    def forward(self, token_ids: Sequence[int], cache: Any, logits_for: int = 1
                ) -> npt.NDArray[np.float32]:
        assert isinstance(cache, TransformersCache)
        self.calls += 1
        held = self._held.get(id(cache), [])[: cache.length()] + list(token_ids)
        self._held[id(cache)] = held
        logits = super().forward(token_ids, cache, logits_for)
        self.forwards.append((list(held), logits[-1].copy()))
        if self.steer is None:
            return logits
        logits = logits.copy()
        end = cache.length()
        for back in range(logits.shape[0]):
            self.steer(end - back, logits[-1 - back])
        return logits

    def forward_batch(self, items: Any, logits_for: int = 1) -> list[npt.NDArray[np.float32]]:
        self.calls += 1
        outputs = super().forward_batch(items, logits_for)
        if self.steer is None:
            return outputs
        steered = []
        for (_, cache), logits in zip(items, outputs, strict=True):
            logits = logits.copy()
            end = cache.length()
            for back in range(logits.shape[0]):
                self.steer(end - back, logits[-1 - back])
            steered.append(logits)
        return steered

    def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int], cache: Any
                     ) -> tuple[npt.NDArray[np.float32], TransformersCache]:
        self.calls += 1
        return super().forward_tree(token_ids, parents, cache)


def script(start: int, tokens: Sequence[int]) -> Steer:
    """Make the model write `tokens` from context length `start` on (logit 1e4 each)."""
    wanted = list(tokens)

    def steer(position: int, logits: npt.NDArray[np.float32]) -> None:
        k = position - start
        if 0 <= k < len(wanted):
            logits[wanted[k]] = 1e4

    return steer


def eos_from(length: int, eos: int) -> Steer:
    """Make the model want EOS once the context holds `length` tokens."""

    def steer(position: int, logits: npt.NDArray[np.float32]) -> None:
        if position >= length:
            logits[eos] = 1e4

    return steer


class ScriptedServer(HFTokenizerMixin):
    """A server on the tiny model's tokenizer: answers each completion with the next scripted
    text (tokenized here), recording the requests; scores options by a fixed table."""

    capabilities = Capabilities(batches_itself=True, heals_in_context=False, lookahead=False)

    def __init__(self, tiny: TransformersBackend, replies: Sequence[str],
                 scores: dict[str, float] | None = None, llguidance: bool = True) -> None:
        self.tokenizer = tiny.tokenizer
        self._vocab_size = tiny.vocab_size
        self._eos: list[int] = []
        self.name, self.device, self.dtype, self.load_s = "scripted", "server", "server", 0.0
        self._markers: dict[str, tuple[str, str] | None] = {}
        self.replies = list(replies)
        self.scores = scores or {}
        self.requests: list[dict[str, Any]] = []
        self.llguidance = llguidance

    def hole_sampler(self) -> HoleSampler:
        return self

    def prompt_scorer(self) -> PromptScorer:
        return self

    def complete(self, prompt: Sequence[int], max_tokens: int, **kwargs: Any) -> Completion:
        self.requests.append({"prompt": list(prompt), "max_tokens": max_tokens, **kwargs})
        ids = self.encode(self.replies.pop(0))[:max_tokens]
        return Completion(ids, [-0.5] * len(ids), "length" if len(ids) == max_tokens else "eos",
                          len(prompt), 0)

    def reads_llguidance(self) -> bool:
        return self.llguidance

    def score_continuations(self, context: Sequence[int],
                            rows: Sequence[Sequence[int]]) -> ScoredRows:
        texts = [self.decode(row).strip() for row in rows]
        return ScoredRows([[self.scores.get(t, -5.0)] + [0.0] * (len(r) - 1)
                           for t, r in zip(texts, rows, strict=True)], len(context), 0)
