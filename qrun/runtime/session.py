"""Session: the only mutable per-run state — the context's token ids, the model's KV cache for
them, and the counters. Fixed text is tokenized once and fed lazily, so the tokens appended
between two model decisions (a sampled token plus the next fixed segment) go through the model
in one forward, and text after the last hole never needs a forward at all."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from qrun.backends.base import Backend, KVCache
from qrun.runtime.stats import Stats


class Session:
    """Token ids and KV cache of one run.

    Invariant: the cache holds exactly `token_ids[:fed]`; `token_ids[fed:]` are appended but not
    yet fed; `_logits` is the next-token distribution after all of `token_ids` when not None.
    """

    def __init__(self, backend: Backend, stats: Stats | None = None) -> None:
        self.backend = backend
        self.stats = stats if stats is not None else Stats()
        self.cache: KVCache = backend.new_cache()
        self.token_ids: list[int] = []
        self.fed = 0
        self._logits: torch.Tensor | None = None

    def append_text(self, text: str) -> list[int]:
        """Append fixed text: tokenized once, as one segment; fed when logits are next needed."""
        if not text:
            return []
        ids = self.backend.encode(text)
        self.append_tokens(ids)
        self.stats.prompt_tokens += len(ids)
        return ids

    def append_tokens(self, token_ids: Sequence[int]) -> None:
        """Append token ids to the context (fed lazily)."""
        if token_ids:
            self.token_ids.extend(token_ids)
            self._logits = None

    def next_logits(self) -> torch.Tensor:
        """Logits [V] for the token after the whole context, feeding what is not fed yet in
        one forward. An empty context first gets the model's start token."""
        if self._logits is not None:
            return self._logits
        if not self.token_ids:
            self.token_ids.append(self.backend.start_token_id)
        if self.fed == len(self.token_ids):
            # Everything is fed but the logits were dropped (after a rollback to a point
            # whose logits were not kept): re-feed the last token.
            self.rollback(self.fed - 1)
        new = self.token_ids[self.fed :]
        logits = self.forward(new)
        self.fed = len(self.token_ids)
        self._logits = logits[-1]
        return self._logits

    def forward(self, token_ids: Sequence[int], logits_for: int = 1) -> torch.Tensor:
        """One counted, timed forward of `token_ids` on top of the cache."""
        started = time.perf_counter()
        logits = self.backend.forward(token_ids, self.cache, logits_for)
        self.stats.model_s += time.perf_counter() - started
        self.stats.forward_calls += 1
        self.stats.forward_tokens += len(token_ids)
        return logits

    def rollback(self, length: int) -> None:
        """Truncate the context to its first `length` tokens, cropping the KV cache; positions
        dropped after being computed are counted in rollback_tokens."""
        if length < 0 or length > len(self.token_ids):
            raise ValueError(f"cannot roll a {len(self.token_ids)}-token context back to {length}")
        if length == len(self.token_ids):
            return
        del self.token_ids[length:]
        if self.fed > length:
            self.stats.rollback_tokens += self.fed - length
            self.cache.crop(length)
            self.fed = length
        self._logits = None

    def finish(self) -> None:
        """Record the final context length."""
        self.stats.context_tokens = len(self.token_ids)
