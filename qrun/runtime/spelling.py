"""Which tokens spell a value as the tokenizer would: what particles may propose
(runtime/particles.py, docs/language.md §14.8). A token is proposed after another only where
the tokenizer reads their bytes together as these two tokens (a canonical pair) and the value
can end or go on by one after it. A split the tokenizer never makes (" sl" then "eeps") is text
the model reads badly: the plain masked proposal spends most particles on such paths, of
negligible weight (SmolLM2, "A bird sleeps.": 64 particles' estimate of the language's mass
11 nats short of the exact one), while the model's conditional over canonical spellings holds
nearly all of the mass."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend
from qrun.constraint import Cursor
from qrun.constraint.vocab import token_lengths

TAIL = 1e-4
"""The share of a step's allowed mass, its least likely tokens, that particles never propose:
the checks below run on the rest only (at most HEAD tokens)."""
HEAD = 32
CONTINUATIONS = 32
"""How many tokens that could follow a proposed token are tried for a canonical pair (the
longest first) before the proposed token is taken for a dead end."""


class Spellings:
    """The checks for one hole's particles, which ask them again and again: whether two
    tokens form a canonical pair (remembered per pair), and what a particle that wrote these
    tokens may propose next (per path: a copy made by resampling asks it again)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.lengths = token_lengths(backend.vocabulary)
        self.pairs: dict[tuple[int, int], bool] = {}
        self.known: dict[tuple[int, ...], npt.NDArray[np.intp]] = {}

    def proposable(self, tokens: Sequence[int], cursor: Cursor, left: int,
                   masked: npt.NDArray[np.float64], stops: list[int]) -> npt.NDArray[np.bool_]:
        """Which tokens a particle that wrote `tokens` (its cursor there, `left` tokens left)
        may propose: of the allowed ones (`masked` > 0), the likeliest holding all but TAIL
        of their mass (at most HEAD), those that form a canonical pair with its last token and
        after which the value can end or go on by a canonical pair; and the tokens that end
        the value (`stops`)."""
        path = tuple(tokens)  # the cursor's state and the logits follow from it
        if path in self.known:
            keep = np.zeros(len(masked), dtype=np.bool_)
            keep[self.known[path]] = True
            return keep
        allowed = np.flatnonzero(masked)
        total = float(masked[allowed].sum())
        if len(allowed) > HEAD:
            allowed = allowed[np.argpartition(-masked[allowed], HEAD)[:HEAD]]
        order = allowed[np.argsort(-masked[allowed], kind="stable")]
        cumulative = np.cumsum(masked[order])
        head = order[: int(np.searchsorted(cumulative, (1.0 - TAIL) * total)) + 1]
        keep = np.zeros(len(masked), dtype=np.bool_)
        ends = set(stops)
        previous = tokens[-1] if tokens else None
        for token in head.tolist():
            keep[token] = token in ends or (
                (previous is None or self.canonical_pair(previous, token))
                and self.goes_on(cursor, token, left))
        self.known[path] = np.flatnonzero(keep)
        return keep

    def goes_on(self, cursor: Cursor, token: int, left: int) -> bool:
        """Whether after `token` the value can end, or go on by a token that forms a
        canonical pair with it (of the longest CONTINUATIONS the constraint allows)."""
        cursor.advance(token)
        try:
            if cursor.can_end() or left <= 1:
                return cursor.can_end()
            nexts = np.flatnonzero(cursor.allowed(left - 1))
            nexts = nexts[~np.isin(nexts, list(self.backend.eos_token_ids))]
            if len(nexts) > CONTINUATIONS:
                lengths = self.lengths[nexts]
                nexts = nexts[np.argpartition(-lengths, CONTINUATIONS)[:CONTINUATIONS]]
            longest = nexts[np.argsort(-self.lengths[nexts], kind="stable")]
            return any(self.canonical_pair(token, int(t)) for t in longest)
        finally:
            cursor.rollback(1)

    def canonical_pair(self, first: int, second: int) -> bool:
        """Whether the tokenizer reads the two tokens' bytes as these two tokens (bytes that
        are not text alone are let through: a pair inside one character)."""
        found = self.pairs.get((first, second))
        if found is None:
            found = self.pairs[first, second] = reads_as_pair(self.backend, first, second)
        return found


def reads_as_pair(backend: Backend, first: int, second: int) -> bool:
    """Whether the backend's tokenizer encodes the two tokens' bytes, as text, as them."""
    token_bytes = backend.vocabulary.token_bytes
    try:
        text = ((token_bytes[first] or b"") + (token_bytes[second] or b"")).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return backend.encode(text) == [first, second]
