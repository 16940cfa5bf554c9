"""The backend interface the runtime uses: a tokenizer, a vocabulary of token bytes, and a
forward pass over new token ids on top of an opaque KV cache. Adapters implement it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from qrun.runtime.prefix_cache import PrefixCache
    from qrun.runtime.vocab import Vocabulary


@runtime_checkable
class KVCache(Protocol):
    """The model's key/value state for the positions fed so far. Opaque to the runtime apart
    from its length and two cheap operations."""

    def length(self) -> int:
        """Number of positions held."""
        ...

    def crop(self, length: int) -> None:
        """Drop every position from `length` on (length ≤ self.length())."""
        ...

    def fork(self) -> KVCache:
        """An independent cache with the same positions; extending or cropping either one
        leaves the other unchanged."""
        ...

    def storages(self) -> list[tuple[int, int]]:
        """(data pointer, bytes) of each distinct tensor storage held, for memory budgets."""
        ...

    def release(self, wait: bool = False) -> None:
        """The caller will not feed this cache until more text comes (a hole or the run has
        ended): a backend that holds something ready for the next token (vLLM's live
        request) lets it go; with `wait`, until it is gone."""
        ...

    def take_counts(self) -> tuple[int, int] | None:
        """(positions computed, positions served from the backend's own cache) since the last
        call, for backends whose forwards compute other than exactly the tokens given (vLLM
        recomputes a prompt's tail past its cached blocks); None for the others."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A loaded model. Long-lived and read-only apart from `prefix_cache` (thread-safe, None
    when off): many sessions may share one backend."""

    name: str
    device: str
    dtype: str
    load_s: float
    prefix_cache: PrefixCache | None

    @property
    def vocab_size(self) -> int:
        """Width of the logits (may exceed the tokenizer's length)."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end generation."""
        ...

    @property
    def start_token_id(self) -> int:
        """The token fed when logits are needed and the context is still empty."""
        ...

    @property
    def vocabulary(self) -> Vocabulary:
        """Token bytes for masks, stop strings and decoding (built once per backend)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` alone, no special tokens added."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids (special tokens skipped)."""
        ...

    def chat_markers(self, role: str) -> tuple[str, str] | None:
        """The text the model's chat template puts before and after a `role` message, or None
        when the model has no chat template."""
        ...

    def new_cache(self) -> KVCache:
        """An empty KV cache on the model's device."""
        ...

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, logits_for: int = 1
    ) -> torch.Tensor:
        """Feed `token_ids` after the cache's positions, extending the cache in place.

        Returns the float32 logits of the last `logits_for` positions, shape [logits_for, V],
        on the model's device.
        """
        ...


@dataclass(frozen=True, slots=True)
class ScoredRows:
    """Per row, the log-probability of each of its tokens in context; and the positions the
    backend computed and served from its own cache to get them."""

    logprobs: list[list[float]]
    computed: int
    cached: int


@dataclass(frozen=True, slots=True)
class Completion:
    """One hole sampled by a server: the tokens (an end-of-sequence token not included), their
    log-probabilities, why it ended ("stop": a stop string, "eos", or "length"), and the
    positions it computed / served from its prefix cache when it reports them."""

    token_ids: list[int]
    logprobs: list[float]
    finish: str
    computed: int
    cached: int


@runtime_checkable
class HoleSampler(Protocol):
    """Backends that sample a whole hole per request (a vLLM server)."""

    def complete(self, prompt: Sequence[int], max_tokens: int, *, temperature: float,
                 top_p: float, top_k: int, seed: int, stop: Sequence[str] = (),
                 regex: str | None = None) -> Completion:
        """Sample up to max_tokens after `prompt` (token ids), under `regex` (the server's
        dialect) when given, ending at a stop string when one is given."""
        ...


@runtime_checkable
class PromptScorer(Protocol):
    """Backends that score continuations through prompt log-probabilities (vLLM)."""

    def score_continuations(
        self, context: Sequence[int], rows: Sequence[Sequence[int]]
    ) -> ScoredRows:
        """The log-probability of each token of each row, following `context`."""
        ...


@runtime_checkable
class TreeScorer(Protocol):
    """Backends that can score a tree of continuations of one cache in a single forward
    (select: options sharing leading tokens share their positions)."""

    def forward_tree(
        self, token_ids: Sequence[int], parents: Sequence[int], cache: KVCache
    ) -> tuple[torch.Tensor, KVCache]:
        """Feed `token_ids` as a tree after the cache's positions: node i follows node
        `parents[i]` (an earlier node; -1: the cache's last position) and sees only the cache
        and its own ancestors. `cache` is left unchanged. Returns the logits after each node,
        [n, V], and a cache holding the cache's positions then every node."""
        ...

    def keep_path(self, tree: KVCache, length: int, path: Sequence[int]) -> KVCache:
        """From a cache returned by forward_tree over a `length`-position cache: the cache of
        those positions followed by the nodes `path` (a root-to-node chain), in order."""
        ...
