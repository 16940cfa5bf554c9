"""Filling one `gen` hole token by token: sampling under an optional mask, stop strings
(found even when split across tokens, and taken back out of the context), EOS and max_tokens."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from qrun.runtime.sampler import SamplingParams, sample
from qrun.runtime.session import Overshoot, Session


class Cursor(Protocol):
    """A hole's constraint state (runtime/masks.py MaskCursor implements it)."""

    def allowed(self, tokens_left: int) -> torch.Tensor:
        """Bool mask [V] (on the CPU) of tokens that keep a full match reachable within
        `tokens_left` tokens, EOS included where the text so far is a full match."""
        ...

    def can_end(self) -> bool:
        """The text so far is a full match."""
        ...

    def can_continue(self) -> bool:
        """Some non-empty continuation is still possible."""
        ...

    def advance(self, token_id: int) -> None:
        """Consume a token (one that allowed() admitted)."""
        ...


class HoleFailure(Exception):
    """A hole cannot be completed legally; the executor turns it into a GenerationError
    carrying the hole's span."""


@dataclass(slots=True)
class HoleRecord:
    """What one hole produced: its value and, per token, id, log-probability and whether it was
    forced. `finish` is "stop", "eos", "max_tokens", "match" (constraint complete) or "select"."""

    name: str
    value: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    finish: str = ""
    seconds: float = 0.0
    option_logprobs: dict[str, float] | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "value": self.value,
            "token_ids": self.token_ids,
            "logprobs": [round(lp, 6) for lp in self.logprobs],
            "forced": self.forced,
            "finish": self.finish,
            "seconds": round(self.seconds, 6),
        }
        if self.option_logprobs is not None:
            out["option_logprobs"] = {k: round(v, 6) for k, v in self.option_logprobs.items()}
        return out


@dataclass(frozen=True, slots=True)
class GenRequest:
    """A `gen` hole with its arguments evaluated. `prefix` is the healed text (bytes taken
    back from the context that the hole must produce first; not part of the value), and the
    cursor, when given, already includes it."""

    name: str
    max_tokens: int
    stop: tuple[str, ...]
    sampling: SamplingParams
    generator: torch.Generator | None
    cursor: Cursor | None = None
    prefix: bytes = b""
    # The healed token is still the context's last token (Session.heal keep_last): the first
    # step decides from the logits before it and keeps it if the model writes it again.
    healed_in_context: bool = False


class _Hole:
    """The bytes and tokens of a hole in progress. `text` starts with the healed prefix;
    `ends[k]` is the byte offset in `text` where hole token k ends."""

    def __init__(self, session: Session, request: GenRequest) -> None:
        self.session = session
        self.request = request
        self.vocab = session.backend.vocabulary
        self.speculative = request.healed_in_context
        self.start = len(session.token_ids) - (1 if self.speculative else 0)
        self.text = bytearray()
        self.ends: list[int] = []
        self.record = HoleRecord(request.name, "")

    @property
    def value_tokens(self) -> int:
        """Tokens that carry value bytes (tokens wholly inside the healed prefix are free)."""
        plen = len(self.request.prefix)
        return sum(1 for end in self.ends if end > plen)

    def take(self, token: int, logprob: float, forced: bool) -> int | None:
        """Append a token to the context and the hole; return the byte offset of a stop
        string it completed, if any. The first token of a speculatively healed hole is kept
        in place when it is the healed token itself, else the healed token is taken back."""
        if self.speculative:
            self.speculative = False
            context = self.session.token_ids
            if context[self.start :] == [token]:
                self.session.fixed_tail = 0
            else:
                self.session.rollback(self.start)
                self.session.append_tokens([token])
        else:
            self.session.append_tokens([token])
        self.record.token_ids.append(token)
        self.record.logprobs.append(logprob)
        self.record.forced.append(forced)
        before = len(self.text)
        self.text += self.vocab.token_bytes[token] or b""
        self.ends.append(len(self.text))
        if self.request.cursor is not None:
            self.request.cursor.advance(token)
        plen = len(self.request.prefix)
        searched, start = max(0, before - plen), 0
        while True:
            found = find_stop(self.text[plen:], self.request.stop, searched, start)
            if found is None:
                return None
            if self._matches_before(plen + found):
                return found + plen
            # With a constraint, a stop string ends the hole only where the value before it
            # is a full match; elsewhere it is ordinary text the constraint allowed.
            start = found + 1

    def _matches_before(self, offset: int) -> bool:
        cursor = self.request.cursor
        index = getattr(cursor, "index", None)
        if cursor is None or index is None:
            return True
        fresh = index.start()
        fresh.advance_bytes(bytes(self.text[:offset]))
        return bool(fresh.can_end())

    def cut_at_stop(self, stop_at: int) -> None:
        """End the value at a stop string. Tokens wholly before it stay; the tokens from the
        one holding the stop's first byte on stay provisionally (Session.overshoot)."""
        kept = sum(1 for end in self.ends if end <= stop_at)
        begin = self.ends[kept - 1] if kept else 0
        if kept < len(self.ends):
            self.session.overshoot = Overshoot(
                start=self.start + kept,
                value_bytes=bytes(self.text[begin:stop_at]),
                token_bytes=bytes(self.text[begin:]),
            )
        del self.text[stop_at:]

    def value(self) -> str:
        return bytes(self.text[len(self.request.prefix) :]).decode("utf-8", errors="replace")


def generate(
    session: Session, request: GenRequest, on_text: Callable[[str], None] | None = None
) -> HoleRecord:
    """Generate one hole into the session's context and return its record.

    EOS and stop strings are not part of the value. Tokens sampled past a stop string stay
    provisionally and are kept only if the following fixed text begins with them
    (docs/language.md §14.4).
    Where the constraint forces text, it is appended without sampling (fast-forward).

    Raises:
        HoleFailure: max_tokens ran out before the constraint accepted, or no token is allowed.
    """
    started = time.perf_counter()
    session.settle()
    session.ensure_start()  # before the hole's start position is taken
    hole = _Hole(session, request)
    eos = session.backend.eos_token_ids
    cursor = request.cursor
    streamed = len(request.prefix)
    finish = "max_tokens"
    while hole.value_tokens < request.max_tokens:
        stop_at = _fast_forward(hole, request.max_tokens - hole.value_tokens)
        tokens_left = request.max_tokens - hole.value_tokens  # forced tokens count too
        if stop_at is None and tokens_left > 0:
            mask = _mask(session, hole, tokens_left)
            only = _only_token(mask)
            if only is not None and only not in eos:
                # One legal token (inside a healed prefix, or a forced byte the text-level
                # fast-forward left to the model): take it without asking for logits, so its
                # forward joins the next one.
                session.stats.forced_tokens += 1
                stop_at = hole.take(only, float("nan"), forced=True)
            else:
                logits = session.logits_before_last() if hole.speculative else session.next_logits()
                token, logprob = sample(logits, mask, request.sampling, request.generator)
                if token in eos:
                    finish = "eos"
                    break
                session.stats.generated_tokens += 1
                stop_at = hole.take(token, logprob, forced=False)
        if stop_at is not None:
            hole.cut_at_stop(stop_at)
            finish = "stop"
            break
        if on_text is not None:
            streamed = _stream(hole.text, streamed, request.stop, on_text)
        if cursor is not None and not cursor.can_continue():
            finish = "match"
            break
    record = hole.record
    record.finish = finish
    # A stop was only taken where the value before it matched (_Hole.take).
    if cursor is not None and finish != "stop" and not cursor.can_end():
        raise HoleFailure(
            f"hole '{request.name}' stopped ({finish}) before its value matched the "
            f"constraint; value so far: {hole.value()!r}"
        )
    record.value = hole.value()
    if on_text is not None and streamed < len(hole.text):
        on_text(bytes(hole.text[streamed:]).decode("utf-8", errors="replace"))
    record.seconds = time.perf_counter() - started
    return record


def _only_token(mask: torch.Tensor | None) -> int | None:
    """The single token a mask allows, if it allows exactly one."""
    if mask is None:
        return None
    allowed = np.flatnonzero(mask.numpy())
    return int(allowed[0]) if len(allowed) == 1 else None


def _in_prefix(hole: _Hole) -> bool:
    return len(hole.text) < len(hole.request.prefix)


def _fast_forward(hole: _Hole, tokens_left: int) -> int | None:
    """Append the text the constraint forces (one continuation only) as tokens, without
    sampling; they are fed with the next forward, all at once. Returns a completed stop."""
    cursor = hole.request.cursor
    forced_bytes = getattr(cursor, "forced_bytes", None)
    if forced_bytes is None or _in_prefix(hole):
        return None
    forced = forced_bytes()
    if not forced:
        return None
    token_ids = _forced_tokens(hole, forced)[:tokens_left]
    if not token_ids or not _still_feasible(cursor, token_ids, tokens_left):
        return None
    stop_at = None
    for token in token_ids:
        hole.session.stats.forced_tokens += 1
        stop_at = hole.take(token, float("nan"), forced=True)
        if stop_at is not None:
            break
    return stop_at


def _still_feasible(cursor: Any, token_ids: list[int], tokens_left: int) -> bool:
    # Forced text is necessary, but its canonical tokens may be more than the fewest that
    # could carry it; under a tight max_tokens, sampling (which the budget-aware mask steers)
    # must then do it instead.
    trial = cursor.copy()
    for token in token_ids:
        trial.advance(token)
    left = tokens_left - len(token_ids)
    return bool(trial.can_end()) or (left > 0 and bool(trial.allowed(left).numpy().any()))


def _forced_tokens(hole: _Hole, forced: bytes) -> list[int]:
    # Canonical tokens of the forced text, less the last one when a longer token could start
    # with it (then the model may legitimately merge it with what follows: `"` into `",`);
    # llguidance's fast-forward rule, reduced to the last token.
    try:
        text = forced.decode("utf-8")
    except UnicodeDecodeError:
        return []
    token_ids = hole.session.backend.encode(text)
    vocab = hole.vocab
    if b"".join(vocab.token_bytes[t] or b"" for t in token_ids) != forced:
        return []
    if token_ids and vocab.has_extension(vocab.token_bytes[token_ids[-1]] or b""):
        token_ids.pop()
    return token_ids


def _mask(session: Session, hole: _Hole, tokens_left: int) -> torch.Tensor | None:
    """The cursor's mask for this step (EOS included where the value may end here).

    While the healed prefix is being produced, a token that ends inside it costs nothing
    against max_tokens, so it may leave one more token for the value; any other token
    counts and gets the plain budget."""
    request = hole.request
    if request.cursor is None:
        return None
    started = time.perf_counter()
    mask = request.cursor.allowed(tokens_left)
    if _in_prefix(hole):
        remaining = request.prefix[len(hole.text) :]
        free = [t for cut in range(1, len(remaining) + 1)
                for t in hole.vocab.ids_of(remaining[:cut])]
        if free:
            roomier = request.cursor.allowed(tokens_left + 1)
            mask = mask.clone()
            mask[free] |= roomier[free]
    # numpy's any(): torch's has 12-16 ms outliers on a busy 2-core machine (intra-op pool).
    empty = not mask.numpy().any()
    session.stats.mask_s += time.perf_counter() - started
    if empty:
        raise HoleFailure(
            f"no token can continue hole '{request.name}' legally within {tokens_left} token(s)"
        )
    return mask


def find_stop(
    text: bytes | bytearray, stops: Sequence[str], searched: int, start: int = 0
) -> int | None:
    """Byte offset of the earliest stop string in `text` that ends after offset `searched`
    (earlier text was already searched) and begins at or after `start`, or None."""
    best: int | None = None
    for stop in stops:
        needle = stop.encode("utf-8")
        found = bytes(text).find(needle, max(start, searched - len(needle) + 1))
        if found >= 0 and (best is None or found < best):
            best = found
    return best


def _stream(
    text: bytearray, streamed: int, stops: Sequence[str], on_text: Callable[[str], None]
) -> int:
    # Hold back any tail that could still turn out to begin a stop string, and bytes of an
    # unfinished UTF-8 character.
    hold = max((len(s.encode()) - 1 for s in stops), default=0)
    limit = len(text) - hold
    while limit > streamed and not _utf8_boundary(text, limit):
        limit -= 1
    if limit > streamed:
        on_text(bytes(text[streamed:limit]).decode("utf-8", errors="replace"))
        return limit
    return streamed


def _utf8_boundary(text: bytearray, offset: int) -> bool:
    """Whether `offset` falls between two UTF-8 characters of `text` (at the end: whether the
    last character is complete, since a token may stop halfway through one)."""
    if offset < len(text):
        return (text[offset] & 0xC0) != 0x80
    lead = len(text) - 1
    while lead >= 0 and len(text) - lead <= 4 and (text[lead] & 0xC0) == 0x80:
        lead -= 1
    if lead < 0 or text[lead] < 0x80:
        return True
    size = 2 if text[lead] >= 0xC0 else 1
    size = 3 if text[lead] >= 0xE0 else size
    size = 4 if text[lead] >= 0xF0 else size
    return len(text) - lead >= size
