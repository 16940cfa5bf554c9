"""Drafting tokens for speculation inside holes (docs/language.md §14.10): most hole text is
copied or predictable from the context (an answer quoted from a document, a name repeated, the
rest of a JSON key), so the tokens that followed the longest recent n-gram matching the
context's suffix (prompt lookup) are a cheap guess at what the model writes next. The session
feeds the guess with the step's own forward (Session.lookahead); each guessed token the model
then chooses costs no forward of its own."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

MAX_NGRAM = 5
"""The longest suffix looked up (longer matches predict better; 5 tokens is a phrase)."""
MIN_NGRAM = 2
"""The shortest: a single repeated token predicts too poorly to be worth a longer forward."""
MAX_DRAFT = 8
"""Tokens drafted per step at most: a forward over k new tokens costs little more than over
one on a CPU (the weights are read once), up to a point (bench/RESULTS.md, speculation)."""


WINDOW = 16
"""Drafted tokens whose fate (accepted or not) the gate on drafting looks at."""
PROBE_EVERY = 8
"""While the gate holds drafting back, every 8th step still drafts one token, so text the model
starts to copy is noticed."""


def next_limit(accepted: int | None) -> int:
    """How many tokens to draft after a draft of which `accepted` were taken (None: no draft
    yet): one after a miss (a wrong guess then costs one position), growing with each hit, so
    text the model copies gets long drafts and text it does not gets almost no extra work."""
    if accepted is None:
        return 2
    return min(MAX_DRAFT, 2 * accepted + 1)


class PromptLookup:
    """An index of the context's n-grams (MIN_NGRAM..MAX_NGRAM tokens) to the most recent
    position each started at with a token after it, kept in step with one session's token
    ids as they grow (rebuilt when they shrink)."""

    def __init__(self, min_rate: float = 0.0) -> None:
        """`min_rate`: the share of recently drafted tokens the model must have accepted for
        drafting to go on, the backend's cost of one more token in a forward relative to a
        one-token forward (Capabilities.draft_cost): below it, drafts cost more forward time
        than they save. 0: always draft."""
        self.min_rate = min_rate
        self._starts: list[dict[tuple[int, ...], int]] = []
        self._indexed = 0  # n-grams ending before this position are indexed
        self._ids: list[int] = []  # the token ids indexed so far
        self._last: tuple[int, list[int]] | None = None  # (context length, draft) last time
        self._scored: tuple[int, list[int]] | None = None  # the last draft counted in _fates
        self._fates: deque[bool] = deque(maxlen=WINDOW)  # per drafted token: accepted?
        self._held_back = 0
        self._reset()

    def _reset(self) -> None:
        self._starts = [{} for _ in range(MAX_NGRAM + 1)]
        self._indexed = 0
        self._ids = []

    def propose(self, token_ids: Sequence[int], limit: int | None = None) -> list[int]:
        """Tokens that followed the longest earlier occurrence of the context's suffix, or []
        when no suffix of at least MIN_NGRAM tokens occurred before: `limit` of them, or by
        default as many as the last draft's success earns (next_limit)."""
        if limit is None:
            accepted = self._accepted(token_ids)
            self._score(accepted)
            limit = next_limit(accepted)
            if self._gated():
                self._held_back += 1
                if self._held_back % PROBE_EVERY:
                    return []
                limit = 1
        self._catch_up(token_ids)
        draft: list[int] = []
        for n in range(min(MAX_NGRAM, len(token_ids) - 1), MIN_NGRAM - 1, -1):
            start = self._starts[n].get(tuple(token_ids[-n:]))
            if start is not None:
                draft = list(token_ids[start + n : start + n + limit])
                break
        self._last = (len(token_ids), draft) if draft else self._last
        return draft

    def new_hole(self) -> None:
        """A hole starts: its text may be copied where the last hole's was not (a date after a
        free sentence), so the gate starts afresh."""
        self._fates.clear()
        self._held_back = 0

    def _score(self, accepted: int | None) -> None:
        """Count the last draft's tokens in the gate's window, once. A probe the model took
        (drafting was held back) opens the gate again at once."""
        if self._last is None or self._last is self._scored or accepted is None:
            return
        draft = self._last[1]
        if self._held_back and accepted == len(draft):
            self._fates.clear()
            self._held_back = 0
        self._fates.extend([True] * accepted + [False] * (len(draft) - accepted))
        self._scored = self._last

    def _gated(self) -> bool:
        """Whether too few recently drafted tokens were accepted for drafting to pay."""
        fates = self._fates
        return self.min_rate > 0 and len(fates) >= 4 and sum(fates) < self.min_rate * len(fates)

    def _accepted(self, token_ids: Sequence[int]) -> int | None:
        """How many tokens of the last draft the context now holds after where it was made."""
        if self._last is None:
            return None
        at, draft = self._last
        taken = 0
        for guess, token in zip(draft, token_ids[at:], strict=False):
            if guess != token:
                break
            taken += 1
        return taken

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
