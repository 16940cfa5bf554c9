"""Drafting tokens for speculation inside holes (docs/language.md §14.10): most hole text is
copied or predictable from the context (an answer quoted from a document, a name repeated, the
rest of a JSON key), so the tokens that followed the longest recent n-gram matching the
context's suffix (prompt lookup) are a cheap guess at what the model writes next. The session
feeds the guess with the step's own forward (Session.lookahead); each guessed token the model
then chooses costs no forward of its own."""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 5
"""The longest suffix looked up (longer matches predict better; 5 tokens is a phrase)."""
MIN_NGRAM = 2
"""The shortest: a single repeated token predicts too poorly to be worth a longer forward."""
MAX_DRAFT = 8
"""Tokens drafted per step at most: a forward over k new tokens costs little more than over
one on a CPU (the weights are read once), up to a point (bench/RESULTS.md, speculation)."""


class PromptLookup:
    """An index of the context's n-grams (MIN_NGRAM..MAX_NGRAM tokens) to the most recent
    position each started at with a token after it, kept in step with one session's token
    ids as they grow (rebuilt when they shrink)."""

    def __init__(self) -> None:
        self._starts: list[dict[tuple[int, ...], int]] = []
        self._indexed = 0  # n-grams ending before this position are indexed
        self._ids: list[int] = []  # the token ids indexed so far
        self._reset()

    def _reset(self) -> None:
        self._starts = [{} for _ in range(MAX_NGRAM + 1)]
        self._indexed = 0
        self._ids = []

    def propose(self, token_ids: Sequence[int], limit: int = MAX_DRAFT) -> list[int]:
        """Up to `limit` tokens that followed the longest earlier occurrence of the context's
        suffix, or [] when no suffix of at least MIN_NGRAM tokens occurred before."""
        self._catch_up(token_ids)
        for n in range(min(MAX_NGRAM, len(token_ids) - 1), MIN_NGRAM - 1, -1):
            start = self._starts[n].get(tuple(token_ids[-n:]))
            if start is not None:
                return list(token_ids[start + n : start + n + limit])
        return []

    def _catch_up(self, token_ids: Sequence[int]) -> None:
        known = self._ids
        if len(token_ids) < len(known) or list(token_ids[: len(known)]) != known:
            self._reset()  # the context was rolled back or changed: start over
            known = self._ids
        known.extend(token_ids[len(known):])
        # An n-gram starting at p is indexed once a token follows it (p + n < len): the
        # context's own suffix must not find itself.
        for end in range(self._indexed, len(known) - 1):
            for n in range(MIN_NGRAM, MAX_NGRAM + 1):
                start = end - n + 1
                if start >= 0:
                    self._starts[n][tuple(known[start : end + 1])] = start
        self._indexed = max(self._indexed, len(known) - 1)
