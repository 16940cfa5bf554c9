"""Filling a `gen` hole locally, token by token: sampling under an optional mask, stop strings
(found even when split across tokens, and taken back out of the context), EOS, max_tokens and
fast-forward of the text a constraint forces. The hole filler of backends with a StepModel."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from qrun.constraint import ConstraintSpec, Cursor
from qrun.runtime.hole import GenRequest, Hole, HoleFailure, follow_of
from qrun.runtime.result import GenRecord
from qrun.runtime.sampler import sample
from qrun.runtime.session import Session
from qrun.runtime.speculate import PromptLookup


class LocalFiller:
    """The local sampling loop: qrun asks the model for logits and chooses every token."""

    def fill(self, session: Session, request: GenRequest,
             on_text: Callable[[str], None] | None = None) -> GenRecord:
        return generate(session, request, on_text)

    def refuses(self, constraint: ConstraintSpec) -> str | None:
        return None  # every spec was compiled when it was lowered (qrun/constraint/spec.py)


def generate(
    session: Session, request: GenRequest, on_text: Callable[[str], None] | None = None
) -> GenRecord:
    """Generate one hole into the session's context and return its record.

    EOS and stop strings are not part of the value. Tokens sampled past a stop string stay
    provisionally and are kept only if the following fixed text begins with them
    (docs/language.md §14.4). Where the constraint forces text, it is appended without
    sampling (fast-forward).

    Raises:
        HoleFailure: max_tokens ran out before the constraint accepted, or no token is allowed.
    """
    session.settle()
    session.ensure_start()  # before the hole's start position is taken
    hole = Hole(session, request)
    eos = session.backend.eos_token_ids
    cursor = request.cursor
    streamed = len(request.prefix)
    finish = "max_tokens"
    follow = follow_of(session, request.follow)
    # Without a constraint any token is value text: only one holding the next text's whole
    # first token ends the hole (docs/language.md §14.5).
    boundary = follow.tokens if request.constraint is not None else follow.whole
    if request.drafter is not None:
        request.drafter.new_hole()
    while hole.value_tokens < request.max_tokens:
        stop_at = _fast_forward(hole, request.max_tokens - hole.value_tokens)
        tokens_left = request.max_tokens - hole.value_tokens  # forced tokens count too
        if stop_at is None and tokens_left > 0:
            mask, ends = _with_boundary(hole, _mask(session, hole, tokens_left), boundary)
            only = _only_token(mask)
            if only is not None and only not in eos:
                # One legal token (inside a healed prefix, or a forced byte the text-level
                # fast-forward left to the model): take it without asking for logits, so its
                # forward joins the next one.
                session.stats.forced_tokens += 1
                stop_at = hole.take(only, None, forced=True)
            else:
                if request.drafter is not None and not hole.speculative:
                    _draft(hole, request.drafter, tokens_left)
                logits = session.logits_before_last() if hole.speculative else session.next_logits()
                history: tuple[Sequence[int], Sequence[int]] = ((), ())
                if request.sampling.reshapes:
                    # The context before this step: a speculatively healed token is still
                    # the context's last, but these logits are from before it.
                    history = (hole.output_tokens(), session.token_ids[:-1]
                               if hole.speculative else session.token_ids)
                token, logprob = sample(logits, mask, request.sampling, request.generator,
                                        *history)
                recorder = session.recorder
                if token in eos:
                    if recorder is not None:
                        recorder.ended(len(session.token_ids), token, logprob)
                    finish = "eos"
                    break
                session.stats.generated_tokens += 1
                mask_size, top = (recorder.alternatives(logits, mask) if recorder is not None
                                  else (None, None))
                if token in ends:
                    hole.end_at_boundary(token, logprob, b"", mask_size, top)
                    finish = "boundary"
                    break
                stop_at = hole.take(token, logprob, False, mask_size, top)
        if stop_at is not None:
            hole.cut_at_stop(stop_at)
            finish = "stop"
            break
        if on_text is not None:
            streamed = _stream(hole.text, streamed, request.stop, on_text)
        if cursor is not None and not cursor.can_continue():
            finish = "match"
            break
    record = hole.finish(finish, "stopped before its value matched the constraint")
    if on_text is not None and streamed < len(hole.text):
        on_text(bytes(hole.text[streamed:]).decode("utf-8", errors="replace"))
    return record


def _draft(hole: Hole, drafter: PromptLookup, tokens_left: int) -> None:
    """Guess the next tokens (speculation, runtime/speculate.py) and have the session feed them
    with this step's forward, unless its logits are known already (then no forward is due).
    The guess stops at the first token the constraint would not allow at its step, and gets
    the text the constraint forces after it; the model still chooses every token, so the
    output is the same as without speculation (docs/language.md §14.10)."""
    session = hole.session
    if session.ahead or session.has_logits():
        return
    draft = drafter.propose(session.token_ids)
    cursor = hole.request.cursor
    if cursor is not None and draft:
        trial = cursor.copy()
        for k, token in enumerate(draft):
            if k >= tokens_left - 1 or not bool(trial.allowed(tokens_left - k)[token]):
                draft = draft[:k]
                break
            trial.advance(token)
    if draft:
        session.lookahead(draft)


def _with_boundary(hole: Hole, mask: npt.NDArray[np.bool_] | None, boundary: tuple[int, ...]
                   ) -> tuple[npt.NDArray[np.bool_] | None, frozenset[int]]:
    """`mask` with, where the value so far is a full match, the tokens that begin the
    following text and that the constraint does not allow as value text also allowed: the
    model writing one of them ends the hole there (docs/language.md §14.5). Without a
    constraint every token is value text, and all of them end it. Returns the mask and those
    tokens."""
    cursor = hole.request.cursor
    if not boundary or hole.in_prefix():
        return mask, frozenset()
    if hole.request.constraint is None:
        return mask, frozenset(boundary)
    if mask is None or cursor is None or not cursor.can_end():
        return mask, frozenset()
    ends = frozenset(t for t in boundary if not bool(mask[t]))
    if ends:
        mask = mask.copy()  # masks are shared by the index's cache
        mask[list(ends)] = True
    return mask, ends


def _only_token(mask: npt.NDArray[np.bool_] | None) -> int | None:
    """The single token a mask allows, if it allows exactly one."""
    if mask is None:
        return None
    allowed = np.flatnonzero(mask)
    return int(allowed[0]) if len(allowed) == 1 else None


def _fast_forward(hole: Hole, tokens_left: int) -> int | None:
    """Append the text the constraint forces (one continuation only) as tokens, without
    sampling; they are fed with the next forward, all at once. Returns a completed stop."""
    cursor = hole.request.cursor
    if cursor is None or hole.in_prefix():
        return None
    forced = cursor.forced_bytes()
    if not forced:
        return None
    token_ids = _forced_tokens(hole, forced)[:tokens_left]
    if not token_ids or not _still_feasible(cursor, token_ids, tokens_left):
        return None
    stop_at = None
    for token in token_ids:
        hole.session.stats.forced_tokens += 1
        stop_at = hole.take(token, None, forced=True)
        if stop_at is not None:
            break
    return stop_at


def _still_feasible(cursor: Cursor, token_ids: list[int], tokens_left: int) -> bool:
    # Forced text is necessary, but its canonical tokens may be more than the fewest that
    # could carry it; under a tight max_tokens, sampling (which the budget-aware mask steers)
    # must then do it instead.
    trial = cursor.copy()
    for token in token_ids:
        trial.advance(token)
    left = tokens_left - len(token_ids)
    return trial.can_end() or (left > 0 and bool(trial.allowed(left).any()))


def _forced_tokens(hole: Hole, forced: bytes) -> list[int]:
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


def _mask(session: Session, hole: Hole, tokens_left: int) -> npt.NDArray[np.bool_] | None:
    """The cursor's mask for this step (EOS included where the value may end here).

    While the healed prefix is being produced, a token that ends inside it costs nothing
    against max_tokens, so it may leave one more token for the value; any other token
    counts and gets the plain budget."""
    request = hole.request
    if request.cursor is None:
        return None
    started = time.perf_counter()
    mask = request.cursor.allowed(tokens_left)
    if hole.in_prefix():
        remaining = request.prefix[len(hole.text) :]
        free = [t for cut in range(1, len(remaining) + 1)
                for t in hole.vocab.ids_of(remaining[:cut])]
        if free:
            roomier = request.cursor.allowed(tokens_left + 1)
            mask = mask.copy()
            mask[free] |= roomier[free]
        if not hole.ends and request.first_tokens is not None:
            mask = mask & request.first_tokens
    empty = not mask.any()
    session.stats.mask_s += time.perf_counter() - started
    if empty:
        raise HoleFailure(
            f"no token can continue hole '{request.name}' legally within {tokens_left} token(s)",
            cut_off=True)
    return mask


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
