"""Which tokens spell a value as the tokenizer would: what particles may propose
(runtime/particles.py, docs/language.md §14.8). A token is proposed after another only where
the tokenizer reads their bytes together as these two tokens (a canonical pair) and the value
can end or go on by one after it. A split the tokenizer never makes (" sl" then "eeps") is text
the model reads badly: the plain masked proposal spends most particles on such paths, of
negligible weight (SmolLM2, "A bird sleeps.": 64 particles' estimate of the language's mass
11 nats short of the exact one), while the model's conditional over canonical spellings holds
nearly all of the mass."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

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


class Tokenizations:
    """What the backend's tokenizer makes of short texts, remembered for every hole and run on
    that backend (tokenizations_of): whether two tokens form a canonical pair (Spellings) and
    the tokens of a value's rest (runtime/exact.py _canonical). Both are facts of the
    tokenizer alone, and particles ask the same ones in every run of a template: on the 600
    sentences of bench/faithfulness.py each run encoded its paths' rests and pairs anew, about
    13,000 calls of 41 µs (HF tokenizer, SmolLM2), 0.55 s a run when particles walk every
    path token by token (py-spy, transformers, 16 particles)."""

    def __init__(self, backend: Backend) -> None:
        # Weakly: the table is the value of a WeakKeyDictionary keyed by the backend, and a
        # value that held its key would keep the backend (its model) alive for ever.
        self._backend = weakref.ref(backend)
        self._lock = threading.Lock()
        self._pairs: OrderedDict[tuple[int, int], bool] = OrderedDict()
        self._texts: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    @property
    def backend(self) -> Backend:
        backend = self._backend()
        assert backend is not None, "asked through tokenizations_of(backend): it is alive"
        return backend

    def pair(self, first: int, second: int) -> bool:
        """Whether the tokenizer reads the two tokens' bytes as these two tokens (bytes that
        are not text alone are let through: a pair inside one character)."""
        key = (first, second)
        with self._lock:
            found = self._pairs.get(key)
        if found is None:
            found = reads_as_pair(self.backend, first, second)
            self._keep(self._pairs, key, found)
        return found

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokens of `text` as the backend encodes it (control tokens' text as text)."""
        with self._lock:
            found = self._texts.get(text)
        if found is None:
            found = tuple(self.backend.encode(text))
            if len(text) <= TEXT_CHARS:
                self._keep(self._texts, text, found)
        return found

    def _keep(self, table: OrderedDict[Any, Any], key: object, value: object) -> None:
        with self._lock:  # the oldest out past ENTRIES: memory stays bounded
            table[key] = value
            if len(table) > ENTRIES:
                table.popitem(last=False)


ENTRIES = 1 << 16
"""The most pairs, and the most texts, a backend's Tokenizations remembers (each table a few
MB at most)."""
TEXT_CHARS = 256
"""The longest text whose tokens are remembered: the rests of values, not prompts."""

_TOKENIZATIONS: weakref.WeakKeyDictionary[Backend, Tokenizations] = weakref.WeakKeyDictionary()
_TOKENIZATIONS_LOCK = threading.Lock()


def tokenizations_of(backend: Backend) -> Tokenizations:
    """The backend's Tokenizations (held no longer than the backend is)."""
    with _TOKENIZATIONS_LOCK:
        found = _TOKENIZATIONS.get(backend)
        if found is None:
            found = _TOKENIZATIONS[backend] = Tokenizations(backend)
        return found


class Spellings:
    """The checks for one hole's particles, which ask them again and again: whether two
    tokens form a canonical pair (the backend's Tokenizations), and what a particle that wrote
    these tokens may propose next (per path: a copy made by resampling asks it again)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.lengths = token_lengths(backend.vocabulary)
        self.tokenizations = tokenizations_of(backend)
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
        """Whether the tokenizer reads the two tokens' bytes as these two tokens."""
        return self.tokenizations.pair(first, second)


def reads_as_pair(backend: Backend, first: int, second: int) -> bool:
    """Whether the backend's tokenizer encodes the two tokens' bytes, as text, as them."""
    token_bytes = backend.vocabulary.token_bytes
    try:
        text = ((token_bytes[first] or b"") + (token_bytes[second] or b"")).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return backend.encode(text) == [first, second]
