"""The KV cache as the runtime sees it: an opaque handle on the model's key/value state for the
positions fed so far. Each adapter implements it over its engine's own cache."""

from __future__ import annotations

from typing import Protocol


class KVCache(Protocol):
    """The model's key/value state for the positions fed so far. Opaque to the runtime apart
    from its length and a few cheap operations."""

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
