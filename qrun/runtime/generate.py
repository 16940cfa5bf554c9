"""Filling one `gen` hole token by token: sampling under an optional mask, stop strings
(found even when split across tokens, and taken back out of the context), EOS and max_tokens."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from qrun.runtime.sampler import SamplingParams, sample
from qrun.runtime.session import Session


class Cursor(Protocol):
    """A hole's constraint state (runtime/masks.py MaskCursor implements it)."""

    def allowed(self, tokens_left: int) -> torch.Tensor:
        """Bool mask [V] of tokens that keep a full match reachable within `tokens_left`."""
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
    """A `gen` hole with its arguments evaluated."""

    name: str
    max_tokens: int
    stop: tuple[str, ...]
    sampling: SamplingParams
    generator: torch.Generator | None
    cursor: Cursor | None = None


def generate(
    session: Session, request: GenRequest, on_text: Callable[[str], None] | None = None
) -> HoleRecord:
    """Generate one hole into the session's context and return its record.

    On return the context holds exactly the value's tokens after the text before the hole:
    EOS and stop strings are not part of it (a stop string's tokens are rolled back).

    Raises:
        HoleFailure: max_tokens ran out before the constraint accepted, or no token is allowed.
    """
    started = time.perf_counter()
    vocab = session.backend.vocabulary
    eos = session.backend.eos_token_ids
    record = HoleRecord(request.name, "")
    start = len(session.token_ids)
    text = bytearray()
    ends: list[int] = []  # byte end offset of each hole token in `text`
    streamed = 0
    for step in range(request.max_tokens):
        logits = session.next_logits()
        mask = _mask(session, request, eos, request.max_tokens - step)
        token, logprob = sample(logits, mask, request.sampling, request.generator)
        if token in eos:
            record.finish = "eos"
            break
        session.append_tokens([token])
        session.stats.generated_tokens += 1
        record.token_ids.append(token)
        record.logprobs.append(logprob)
        record.forced.append(False)
        if request.cursor is not None:
            request.cursor.advance(token)
        before = len(text)
        text += vocab.token_bytes[token] or b""
        ends.append(len(text))
        stop_at = find_stop(text, request.stop, before)
        if stop_at is not None:
            _cut_at_stop(session, record, text, ends, start, stop_at)
            del text[stop_at:]
            record.finish = "stop"
            break
        if on_text is not None:
            streamed = _stream(text, streamed, request.stop, on_text)
        if request.cursor is not None and not request.cursor.can_continue():
            record.finish = "match"
            break
    else:
        record.finish = "max_tokens"
    if request.cursor is not None and not request.cursor.can_end():
        raise HoleFailure(
            f"hole '{request.name}' stopped ({record.finish}) before its value matched the "
            f"constraint; value so far: {bytes(text).decode('utf-8', 'replace')!r}"
        )
    record.value = bytes(text).decode("utf-8", errors="replace")
    if on_text is not None and streamed < len(text):
        on_text(bytes(text[streamed:]).decode("utf-8", errors="replace"))
    record.seconds = time.perf_counter() - started
    return record


def _mask(
    session: Session, request: GenRequest, eos: frozenset[int], tokens_left: int
) -> torch.Tensor | None:
    if request.cursor is None:
        return None
    started = time.perf_counter()
    mask = request.cursor.allowed(tokens_left).clone()
    if request.cursor.can_end():
        for token in eos:
            mask[token] = True
    session.stats.mask_s += time.perf_counter() - started
    if not bool(mask.any()):
        raise HoleFailure(
            f"no token can continue hole '{request.name}' legally within {tokens_left} token(s)"
        )
    return mask.to(session.next_logits().device)


def find_stop(text: bytes | bytearray, stops: Sequence[str], searched: int) -> int | None:
    """Byte offset of the earliest stop string in `text` that ends after offset `searched`
    (earlier text was already searched), or None."""
    best: int | None = None
    for stop in stops:
        needle = stop.encode("utf-8")
        found = bytes(text).find(needle, max(0, searched - len(needle) + 1))
        if found >= 0 and (best is None or found < best):
            best = found
    return best


def _cut_at_stop(
    session: Session,
    record: HoleRecord,
    text: bytearray,
    ends: list[int],
    start: int,
    stop_at: int,
) -> None:
    # Keep the tokens that end at or before the stop; the rest overshoot into the stop string.
    # Their positions are rolled back, and the bytes of the value they carried ("residual",
    # e.g. "." of a ".\n" token with stop "\n") are appended again as canonical tokens.
    kept = sum(1 for end in ends if end <= stop_at)
    residual = bytes(text[ends[kept - 1] if kept else 0 : stop_at])
    session.rollback(start + kept)
    del record.token_ids[kept:], record.logprobs[kept:], record.forced[kept:]
    if residual:
        ids = session.backend.encode(residual.decode("utf-8", errors="replace"))
        session.append_tokens(ids)
        record.token_ids.extend(ids)
        record.logprobs.extend([float("nan")] * len(ids))
        record.forced.extend([True] * len(ids))


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
    if offset >= len(text):
        return True
    return (text[offset] & 0xC0) != 0x80
