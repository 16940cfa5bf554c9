"""What every way of filling a `gen` hole shares: the request (the hole's arguments evaluated),
the hole's bytes and tokens in progress with its stop-string
rule, and the one tail that turns a finished hole into its record. The local sampling loop
(generate.py) and the server replay (remote.py) are the two fillers built on it."""

from __future__ import annotations

import functools
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from qrun.constraint import ConstraintSpec, Cursor, Vocabulary
from qrun.constraint.spec import typed_value
from qrun.runtime.result import GenRecord
from qrun.runtime.sampler import SamplingParams
from qrun.runtime.session import Overshoot, Session
from qrun.runtime.speculate import PromptLookup
from qrun.runtime.stretch import text_head


class HoleFailure(Exception):
    """A hole cannot be completed legally; the executor turns it into a GenerationError
    carrying the hole's span (a ValueCutOff where `cut_off`: its max_tokens ran out before
    its value matched the constraint)."""

    def __init__(self, message: str, cut_off: bool = False) -> None:
        super().__init__(message)
        self.cut_off = cut_off


@dataclass(frozen=True, slots=True)
class GenRequest:
    """A `gen` hole with its arguments evaluated. `prefix` is the healed text (bytes taken
    back from the context that the hole must produce first; not part of the value), and the
    cursor, when given, already includes it."""

    name: str
    max_tokens: int
    stop: tuple[str, ...]
    sampling: SamplingParams
    generator: np.random.Generator | None
    cursor: Cursor | None = None
    constraint: ConstraintSpec | None = None
    prefix: bytes = b""
    # The healed token is still the context's last token (Session.heal keep_last): the first
    # step decides from the logits before it and keeps it if the model writes it again.
    healed_in_context: bool = False
    # Drafts tokens to check with each step's forward (speculation); None: off.
    drafter: PromptLookup | None = None
    # The template text sure to follow the hole, or None: the hole may end where the model
    # begins it (docs/language.md §14.5).
    follow: str | None = None
    # The stop string that ends the value stays in it and in the context (keep_stop=true).
    keep_stop: bool = False
    # With a prefix: the tokens the hole's first token may be, those holding all of the
    # prefix. A split of the healed text (` ` then `i` then `s` for ` is`) is a tokenization
    # the model never reads, after which it writes garbage (issue #38).
    first_tokens: npt.NDArray[np.bool_] | None = None
    # "mask": token by token under the mask; "exact": drawn from the model's conditional over
    # the constraint's language, scored whole (runtime/exact.py); "smc": `particles` particles
    # (runtime/particles.py); "auto", a particles block's: exact where the language is small,
    # else smc (runtime/engines.py).
    sampler: str = "mask"
    particles: int = 16
    ess_threshold: float = 0.5  # with "smc": resample below this share of N (options.py)


_PUNCTUATION = frozenset(string.punctuation.encode())
_SPACES = frozenset(string.whitespace.encode())
_SEPARATORS = _PUNCTUATION | _SPACES


@dataclass(frozen=True, slots=True)
class Follow:
    """How the template text after a hole begins, as the model could write it.

    plain: its first bytes before any control token (at most the longest token's length);
        b"" when it begins with a control token
    tokens: the tokens that begin it: every ordinary token whose bytes start `plain` or are
        `plain` and then only punctuation or spaces (only spaces where `plain` is spaces: the
        text after may begin with those), or the control token it begins with; EOS never (it
        ends a hole already)
    whole: those of `tokens` that hold at least the text's first token as the tokenizer reads
        it (` Question` or longer for ` Question:`, not ` Q`), or only punctuation (`"` of
        `",`): what ends a hole without a constraint, where any token is value text, ` Q` may
        begin ` QR code` and a lone ` ` the number ` 42`, but a quote rarely goes on as value
    """

    plain: bytes = b""
    tokens: tuple[int, ...] = ()
    whole: tuple[int, ...] = ()


def follow_of(session: Session, text: str | None) -> Follow:
    """The Follow of `text`, the template text sure to follow a hole (None: unknown)."""
    if not text:
        return Follow()
    backend = session.backend
    vocab = backend.vocabulary
    eos = backend.eos_token_ids
    head, control = text_head(backend, text, vocab.max_token_len)
    plain = b"".join(vocab.token_bytes[t] or b"" for t in head)[: vocab.max_token_len]
    if not plain:
        marker = () if control is None or control in eos else (control,)
        return Follow(b"", marker, marker)
    tokens = tuple(token for cut in range(1, len(plain) + 1)
                   for token in vocab.ids_of(plain[:cut]) if token not in eos)
    # A token holding all of that text and then only punctuation or spaces (`",` after `"`
    # where a loop's `, ` or the `]` after it comes next) begins it too: it stays
    # provisionally and is kept if what follows spells the rest (Session.overshoot). After
    # text of spaces alone only more spaces: ` (` after a lone ` ` may well be value.
    tokens += tuple(t for t in _closing_extensions(vocab, plain) if t not in eos)
    first = len(vocab.token_bytes[head[0]] or b"")
    whole = tuple(t for t in tokens if len(data := vocab.token_bytes[t] or b"") >= first
                  or all(byte in _PUNCTUATION for byte in data))
    return Follow(plain, tokens, whole)


@functools.lru_cache(maxsize=256)
def _closing_extensions(vocab: Vocabulary, plain: bytes) -> tuple[int, ...]:
    """The tokens that are `plain` and then punctuation or spaces (only spaces where `plain`
    is spaces), for follow_of: a hole's next text is one of a few per template, so each is
    walked once."""
    return vocab.extensions(plain, _SEPARATORS if plain.strip() else _SPACES)


class HoleFiller(Protocol):
    """How a run fills its `gen` holes on its backend: chosen once when the run starts
    (runtime/engines.py)."""

    def fill(self, session: Session, request: GenRequest,
             on_text: Callable[[str], None] | None) -> GenRecord:
        """Fill one hole into the session's context and return its record.

        Raises:
            HoleFailure: the hole cannot be completed legally.
        """
        ...

    def refuses(self, constraint: ConstraintSpec) -> str | None:
        """Why this filler cannot take `constraint` (asked before any model work for every
        constraint known then), or None."""
        ...


class Hole:
    """The bytes and tokens of a hole in progress. `text` starts with the healed prefix;
    `ends[k]` is the byte offset in `text` where hole token k ends."""

    def __init__(self, session: Session, request: GenRequest) -> None:
        self.started = time.perf_counter()
        self.session = session
        self.request = request
        self.vocab = session.backend.vocabulary
        self.speculative = request.healed_in_context
        self.start = len(session.token_ids) - (1 if self.speculative else 0)
        self.text = bytearray()
        self.ends: list[int] = []
        self.record = GenRecord(request.name, "", start=self.start)

    @property
    def value_tokens(self) -> int:
        """Tokens that carry value bytes (tokens wholly inside the healed prefix are free)."""
        plen = len(self.request.prefix)
        return sum(1 for end in self.ends if end > plen)

    def output_tokens(self) -> list[int]:
        """The hole's tokens that carry value bytes: what frequency and presence penalties
        count (tokens re-covering the healed prefix give back the template's own text)."""
        plen = len(self.request.prefix)
        return [token for token, end in zip(self.record.token_ids, self.ends, strict=True)
                if end > plen]

    def in_prefix(self) -> bool:
        """Whether the healed prefix is not produced yet."""
        return len(self.text) < len(self.request.prefix)

    def take(self, token: int, logprob: float | None, forced: bool,
             mask_size: int | None = None, top: list[tuple[int, float]] | None = None
             ) -> int | None:
        """Append a token to the context and the hole; return the byte offset of a stop
        string it completed, if any. The first token of a speculatively healed hole is kept
        in place when it is the healed token itself, else the healed token is taken back.
        `mask_size` and `top` (the allowed tokens and the likeliest ones) go to the trace."""
        session = self.session
        if self.speculative:
            self.speculative = False
            if session.token_ids[self.start :] == [token]:
                session.adopt_healed()
            else:
                session.rollback(self.start, "heal")
                session.append_tokens([token])
        else:
            session.append_tokens([token])
        if session.recorder is not None:
            kind = "forced" if forced else "healed" if self.in_prefix() else "sampled"
            session.recorder.chosen(len(session.token_ids) - 1, token, kind, logprob,
                                    mask_size, top)
        before = len(self.text)
        self.adopt(token, logprob, forced)
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

    def adopt(self, token: int, logprob: float | None, forced: bool = False) -> None:
        """Count `token`, the context's last token already, as the hole's next token: its
        record, its bytes, the cursor (runtime/exact.py appends a whole scored value at once,
        then adopts its tokens)."""
        self.record.token_ids.append(token)
        self.record.logprobs.append(logprob)
        self.record.forced.append(forced)
        self.text += self.vocab.token_bytes[token] or b""
        self.ends.append(len(self.text))
        if self.request.cursor is not None:
            self.request.cursor.advance(token)

    def end_at_boundary(self, token: int, logprob: float | None, value_bytes: bytes = b"",
                        mask_size: int | None = None,
                        top: list[tuple[int, float]] | None = None) -> None:
        """End the value at `token`, a token the model chose that begins the text following
        the hole, after `value_bytes` of value when it also carries the value's last bytes (a
        server's ".<" ending a value in "." before "<br>"; checked by the caller). It stays
        provisionally, like a stop's overshoot, and is kept when that text is appended
        (Session.overshoot). A token with no value bytes is not one of the hole's tokens in
        its record (the trace shows it as the hole's choice)."""
        session = self.session
        assert not self.speculative, "a hole cannot end inside its healed prefix"
        session.append_tokens([token])
        position = len(session.token_ids) - 1
        if session.recorder is not None:
            session.recorder.chosen(position, token, "sampled", logprob, mask_size, top)
        if value_bytes:
            self.record.token_ids.append(token)
            self.record.logprobs.append(logprob)
            self.record.forced.append(False)
            self.text += value_bytes
            self.ends.append(len(self.text))
        session.hold(Overshoot(start=position, value_bytes=value_bytes,
                               token_bytes=self.vocab.token_bytes[token]))

    def _matches_before(self, offset: int) -> bool:
        cursor = self.request.cursor
        return cursor is None or cursor.accepts(bytes(self.text[:offset]))

    def cut_at_stop(self, stop_at: int) -> None:
        """End the value at a stop string (after it, with keep_stop). Tokens wholly before
        that point stay; the tokens from the one holding its first byte on stay provisionally
        (Session.overshoot)."""
        # Of the stop strings that begin there, the longest (["\n", "\n\n"] on "\n\n").
        stop = max((s for s in self.request.stop if self.text.startswith(s.encode(), stop_at)),
                   key=lambda s: len(s.encode()))
        self.record.stop = stop
        if self.request.keep_stop:
            stop_at += len(stop.encode())
        kept = sum(1 for end in self.ends if end <= stop_at)
        begin = self.ends[kept - 1] if kept else 0
        if kept < len(self.ends):
            self.session.hold(Overshoot(
                start=self.start + kept,
                value_bytes=bytes(self.text[begin:stop_at]),
                token_bytes=bytes(self.text[begin:]),
            ))
        del self.text[stop_at:]

    def value(self) -> str:
        return bytes(self.text[len(self.request.prefix) :]).decode("utf-8", errors="replace")

    def finish(self, finish: str, incomplete: str) -> GenRecord:
        """The record of the hole ending for `finish` ("stop", "eos", "max_tokens", "match",
        "boundary").

        Raises:
            HoleFailure: the hole has a constraint its value does not fully match (a stop was
                only taken where the value before it matched); `incomplete` says why.
        """
        cursor = self.request.cursor
        # A stop or a boundary ends a value only where it is a full match (checked there).
        if cursor is not None and finish not in ("stop", "boundary") and not cursor.can_end():
            raise HoleFailure(f"hole '{self.request.name}' {incomplete} ({finish}); value so "
                              f"far: {self.value()!r}", cut_off=finish == "max_tokens")
        record = self.record
        record.finish = finish
        record.value = record.text = self.value()
        if self.request.constraint is not None:
            try:
                record.value = typed_value(record.text, self.request.constraint.value_type)
            except (ValueError, RecursionError) as exc:
                raise HoleFailure(f"hole '{self.request.name}': its value cannot be read as "
                                  f"{self.request.constraint.value_type}: {exc}") from None
        plen = len(self.request.prefix)
        record.healed = self.request.prefix.decode("utf-8", errors="replace")
        record.prefix_tokens = sum(1 for end in self.ends if end <= plen)
        if self.request.constraint is not None:
            record.constraint = self.request.constraint.description
        record.seconds = time.perf_counter() - self.started
        return record


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
