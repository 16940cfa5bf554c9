"""Session: the only mutable per-run state — the context's token ids, the model's KV cache for
them, and the counters. The fixed text between two model decisions is tokenized once, as one
text (runtime/stretch.py), and fed lazily, so the tokens appended between two model decisions
(a sampled token plus the next fixed text) go through the model in one forward, and text after
the last hole never needs a forward at all."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qrun.backends.base import Backend, KVCache, StepModel
from qrun.backends.prefix_cache import PrefixCache
from qrun.runtime.recorder import Recorder
from qrun.runtime.stats import Stats
from qrun.runtime.stretch import Segment, Stretch, TextRun, count_tokens, encode_segments


class ContextFull(Exception):
    """Appending would make the context longer than the model's maximum; raised before any
    forward of the longer context (the executor reports it at the op that caused it)."""


@dataclass(frozen=True, slots=True)
class Overshoot:
    """Tokens at the end of the context that a hole sampled past its end (they hold a stop
    string and maybe more, or begin the text after the hole), kept provisionally: if the next
    fixed text begins with exactly their bytes they stay — the model already wrote that text —
    else they are rolled back.

    start: index in token_ids of the first such token
    value_bytes: bytes of the hole's value inside those tokens (e.g. "." of a ".\\n" token)
    token_bytes: all bytes of token_ids[start:]; None for one control token (a chat marker
        the model wrote where the template's next text begins with it)
    """

    start: int
    value_bytes: bytes
    token_bytes: bytes | None


class Session:
    """Token ids and KV cache of one run.

    Invariants: the cache holds exactly `token_ids[:fed]`; `token_ids[fed:]` are appended but
    not fed yet; `_known[n]` is the next-token distribution after `token_ids[:n]` (kept while
    those n tokens stand); the last `fixed_tail` tokens came from fixed text (token healing may
    take them back). Without a `model` (a server samples whole holes) nothing is ever fed: the
    session keeps the token ids and counters only.

    Speculation (lookahead): the cache may also hold `ahead`, drafted tokens fed after the
    whole context (then fed == len(token_ids)), with `_ahead_logits[j]` the logits after
    token_ids + ahead[: j + 1]. Appending exactly the next of them moves it into the context
    without a forward; any other change of the context first drops them from the cache.
    """

    def __init__(
        self,
        backend: Backend,
        model: StepModel | None,
        stats: Stats | None = None,
        prefix_cache: PrefixCache | None = None,
        recorder: Recorder | None = None,
        cache: KVCache | None = None,
    ) -> None:
        """`cache`: the KV cache to start from (a fork's, Session.fork), else a new one."""
        self.backend = backend
        self.model = model
        self.stats = stats if stats is not None else Stats()
        self.recorder = recorder
        self.prefix_cache = prefix_cache
        if cache is None and model is not None:
            cache = model.new_cache()
        self._cache: KVCache | None = cache
        self.token_ids: list[int] = []
        self.fed = 0
        self.fixed_tail = 0
        self.overshoot: Overshoot | None = None
        # Token positions where a fixed-text segment began or ended: the points where runs of
        # one template diverge, so where KV snapshots are worth keeping.
        self.boundaries: set[int] = set()
        self._known: dict[int, npt.NDArray[np.float32]] = {}
        self.ahead: list[int] = []
        self._ahead_logits: list[npt.NDArray[np.float32]] = []
        self._stretch = Stretch()  # fixed text collected since the last model decision

    @property
    def cache(self) -> KVCache:
        """The KV cache of the context (sessions with a model only)."""
        if self._cache is None:
            raise RuntimeError("this session has no model: its backend samples whole holes")
        return self._cache

    @cache.setter
    def cache(self, cache: KVCache) -> None:
        self._cache = cache

    def append_text(self, text: str, special: bool = False) -> None:
        """Collect text that is not the model's choice (fixed text, an interpolated value, a
        chat marker). It is tokenized with the rest of its stretch, as one text, when the model
        next needs the context (flush). Only with `special` (the template's own text, chat
        markers) can it spell control tokens.

        Raises:
            ContextFull: the context would grow past the model's maximum (checked with a bound
                from the text's bytes, counted exactly each time the collected text doubles).
        """
        self._stretch.add(text, special)
        limit = self.backend.max_context
        stretch = self._stretch
        if (limit is None or len(self.token_ids) + 2 * stretch.size <= limit
                or stretch.size < 2 * stretch.counted_at):
            return
        stretch.counted_at = stretch.size
        count = count_tokens(self.backend, stretch.segments(self.backend.control_tokens))
        self._check_room(count)

    def flush(self) -> None:
        """Tokenize the text collected since the last model decision as one stretch
        (stretch.py) and append its ids, to be fed when logits are next needed. A pending
        overshoot is settled first (kept when the text begins with it)."""
        if not self._stretch:
            return
        stretch, self._stretch = self._stretch, Stretch()
        segments = stretch.segments(self.backend.control_tokens)
        if self.overshoot is not None:
            segments = self._settle_overshoot(segments)
        encoded = encode_segments(self.backend, segments)
        ids = encoded.ids
        if not ids:
            return
        start = len(self.token_ids)
        self._append(ids)
        self.boundaries.update(start + seam for seam in encoded.seams)
        self.boundaries.update((start, len(self.token_ids)))
        if self.recorder is not None:
            self.recorder.fixed(start, ids)
        self.stats.prompt_tokens += len(ids)
        self.fixed_tail += len(ids)

    def append_tokens(self, token_ids: Sequence[int]) -> None:
        """Append model-chosen token ids to the context (fed lazily; already fed when they are
        the tokens looked ahead). Text collected before them is tokenized first."""
        self.flush()
        if not token_ids:
            return
        if self.ahead and list(token_ids) == self.ahead[: len(token_ids)]:
            for token in token_ids:
                self.token_ids.append(token)
                self.fed += 1
                self._known[self.fed] = self._ahead_logits.pop(0)
                self.ahead.pop(0)
            self.stats.accepted_tokens += len(token_ids)
        else:
            self._append(token_ids)
        self.fixed_tail = 0

    def lookahead(self, draft: Sequence[int]) -> None:
        """Feed what is not fed yet and the drafted tokens `draft` after it in one forward,
        keeping the logits after the context and after each drafted token (so the next
        next_logits() needs no forward, nor do the steps whose token is the next drafted
        one). The caller draws the draft; counted in drafted_tokens."""
        self.settle()
        self.ensure_start()
        self._drop_ahead()
        limit = self.backend.max_context
        room = len(draft) if limit is None else max(0, limit - len(self.token_ids))
        draft = list(draft[:room])
        if not draft or self.fed == len(self.token_ids) and len(self.token_ids) in self._known:
            return
        if self.prefix_cache is not None and self.fed < len(self.token_ids):
            self._from_prefix_cache()
        if self.fed == len(self.token_ids):
            # Everything is fed but those logits were not kept: un-feed the last token, keeping
            # it, and feed it again with the draft (as next_logits does).
            self.stats.rollback_tokens += 1
            self.fed -= 1
            self.cache.crop(self.fed)
        start = self.fed
        logits = self.forward([*self.token_ids[start:], *draft], logits_for=len(draft) + 1)
        end = self.fed = len(self.token_ids)
        self._known[end] = logits[0]
        self.ahead, self._ahead_logits = draft, list(logits[1:])
        self.stats.drafted_tokens += len(draft)
        if self.prefix_cache is not None:
            self._into_prefix_cache(start)

    def _drop_ahead(self) -> None:
        """Take the drafted tokens not taken out of the cache (counted as drafted and not
        accepted, not in rollback_tokens: that counts the template's own rework)."""
        if self.ahead:
            self.cache.crop(self.fed)
            self.ahead, self._ahead_logits = [], []

    def _append(self, token_ids: Sequence[int]) -> None:
        self._drop_ahead()
        self._check_room(len(token_ids))
        self.token_ids.extend(token_ids)

    def _check_room(self, more: int) -> None:
        limit = self.backend.max_context
        if limit is not None and len(self.token_ids) + more > limit:
            raise ContextFull(
                f"the context would hold {len(self.token_ids) + more} tokens, more "
                f"than model '{self.backend.name}' takes ({limit})")

    def _settle_overshoot(self, segments: list[Segment]) -> list[Segment]:
        """Keep the overshoot tokens if the context must read value_bytes + the stretch
        `segments` and they spell its beginning; otherwise roll them back. Returns the segments
        still to append. A control token overshoot is kept only where the stretch begins with
        that very token, and ordinary tokens only where their bytes lie in the stretch's first
        run (`<|` before `<|im_end|>` is not the marker)."""
        assert self.overshoot is not None
        over, self.overshoot = self.overshoot, None
        kept = self.token_ids[over.start :]
        first = segments[0] if segments and isinstance(segments[0], TextRun) else TextRun("")
        rest = segments[1:] if segments and isinstance(segments[0], TextRun) else segments
        if over.token_bytes is None:
            if not over.value_bytes and segments and [segments[0]] == kept:
                self._keep_overshoot()
                return segments[1:]
        else:
            wanted = over.value_bytes + first.text.encode("utf-8")
            if wanted.startswith(over.token_bytes):
                try:  # the tokens may end inside a character: then they cannot stay
                    remainder = wanted[len(over.token_bytes):].decode("utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    self._keep_overshoot()
                    skip = len(first.text) - len(remainder)
                    return [first.after(skip), *rest] if remainder else rest
        self.stats.boundary_dropped += 1
        self.rollback(over.start, "stop")
        value = over.value_bytes.decode("utf-8", errors="replace")
        if not value:
            return segments
        return [first.before(value), *rest]

    def hold(self, overshoot: Overshoot) -> None:
        """Keep the tokens a hole sampled past its end provisionally, until the next fixed
        text settles them (flush) or no text comes (settle)."""
        assert self.overshoot is None, "a hole's overshoot is settled before the next"
        self.overshoot = overshoot

    def adopt_healed(self) -> None:
        """The model wrote the healed token again (Session.heal keep_last): it stays, now the
        hole's first token, no longer fixed text healing may take back."""
        self.fixed_tail = 0
        if self.recorder is not None:
            self.recorder.drop(len(self.token_ids) - 1, "heal")

    def _keep_overshoot(self) -> None:
        self.stats.boundary_kept += 1
        self.fixed_tail = 0

    def has_logits(self) -> bool:
        """Whether the logits after the whole context are known (next_logits needs no
        forward)."""
        return not self._stretch and self.overshoot is None and len(self.token_ids) in self._known

    def next_logits(self) -> npt.NDArray[np.float32]:
        """Logits [V] for the token after the whole context, feeding what is not fed yet in
        one forward. An empty context first gets the model's start token."""
        self.flush()
        known = self._known.get(len(self.token_ids))
        if known is not None and self.overshoot is None:
            return known
        if self.overshoot is not None:
            self._drop_overshoot()
        self.ensure_start()
        known = self._known.get(len(self.token_ids))
        if known is not None:
            return known
        if self.prefix_cache is not None and self._from_prefix_cache():
            return self._known[len(self.token_ids)]
        if self.fed == len(self.token_ids):
            # Everything is fed but those logits were not kept (after a rollback, or a prefix
            # cache snapshot without logits): un-feed the last token, keeping it, and feed it
            # again.
            self.stats.rollback_tokens += 1
            self.fed -= 1
            self.cache.crop(self.fed)
        self._feed(1)
        return self._known[len(self.token_ids)]

    def _feed(self, keep: int) -> None:
        """Feed every unfed token in one forward, keeping the logits after the last `keep`
        positions."""
        self._drop_ahead()
        start = self.fed
        logits = self.forward(self.token_ids[start:], logits_for=keep)
        self.fed = end = len(self.token_ids)
        for back in range(min(keep, end - start)):
            self._known[end - back] = logits[-1 - back]
        if self.prefix_cache is not None:
            self._into_prefix_cache(start)

    def ensure_start(self) -> None:
        """Give an empty context the model's start token (logits need something to follow)."""
        if not self.token_ids:
            self.token_ids.append(self.backend.start_token_id)
            if self.recorder is not None:
                self.recorder.fixed(0, self.token_ids)

    def logits_before_last(self) -> npt.NDArray[np.float32]:
        """Logits after all but the last token, which stays in the context: when it is not fed
        yet it goes through the model in the same forward (logits of both positions kept), so
        a healed token the model then writes again costs no extra forward."""
        self.flush()
        self._drop_ahead()
        n = len(self.token_ids)
        if self.prefix_cache is not None and self.overshoot is None and self.fed < n:
            self._from_prefix_cache(n - 1)
        known = self._known.get(n - 1)
        if known is not None:
            return known
        if self.fed < n - 1 and self.overshoot is None:
            self._feed(2)
            return self._known[n - 1]
        # The last token is fed already (its predecessor's logits are gone), or nothing
        # before it is unfed: ask for the logits without it.
        last = self.token_ids.pop()
        if self.fed > len(self.token_ids):
            self.token_ids.append(last)
            self.rollback(n - 1, "heal")
            return self.next_logits()
        before = self.next_logits()
        self.token_ids.append(last)
        return before

    def _from_prefix_cache(self, upto: int | None = None) -> bool:
        """Take the deepest cached KV snapshot on the first `upto` tokens of the context (all
        by default), and the logits after them when cached (True: no forward needed)."""
        assert self.prefix_cache is not None
        self._drop_ahead()
        upto = len(self.token_ids) if upto is None else upto
        hit = self.prefix_cache.lookup(self.token_ids[:upto], self.fed)
        if hit.kv is not None:
            self.stats.cached_tokens += hit.kv_length - self.fed
            if self.recorder is not None:
                self.recorder.cached(self.fed, hit.kv_length)
            self.cache = hit.kv
            self.fed = hit.kv_length
        if hit.logits is None:
            return False
        # The KV may now lag behind token_ids (fed < len): the positions in between are fed
        # with the next forward that needs them, if any does.
        self.stats.cached_logits += 1
        self._known[upto] = hit.logits
        return True

    def _into_prefix_cache(self, start: int) -> None:
        """Record the logits after the context and KV snapshots at the segment boundaries the
        last forward covered (crops of one fork share its storage: no copies)."""
        assert self.prefix_cache is not None
        end = len(self.token_ids)
        multi = end - start > 1
        whole: KVCache | None = None
        if multi:
            whole = self.cache
            if self.ahead:  # the cache runs past the context: keep only the context
                whole = self.cache.fork()
                whole.crop(end)
        self.prefix_cache.insert(self.token_ids, whole, self._known.get(end))
        if not multi:
            return
        for boundary in sorted(b for b in self.boundaries if start < b < end):
            snapshot = self.cache.fork()
            snapshot.crop(boundary)
            self.prefix_cache.insert(self.token_ids[:boundary], snapshot,
                                     self._known.get(boundary))
        before_last = self._known.get(end - 1)
        if before_last is not None and end - 1 not in self.boundaries:
            self.prefix_cache.insert(self.token_ids[: end - 1], None, before_last)

    def settle(self) -> None:
        """Before a hole starts: tokenize the text collected since the last hole, and resolve
        a pending overshoot when no fixed text follows."""
        self.flush()
        if self.overshoot is not None:
            self._drop_overshoot()

    def _drop_overshoot(self) -> None:
        # No fixed text follows the hole (the template ends, or another hole comes next): the
        # overshoot cannot match empty text, so it is rolled back and the value's bytes it
        # carried go back in as canonical tokens.
        rest = self._settle_overshoot([])
        if rest:
            ids = encode_segments(self.backend, rest).ids
            self._append(ids)
            if self.recorder is not None:
                self.recorder.fixed(len(self.token_ids) - len(ids), ids)

    def take_tail(self) -> str:
        """Take back the context's last token when it is fixed text not yet fed (not a control
        token, whole characters) and return its text, else "". Where the context is cut (a
        fork, a hidden block) the text is put back after the cut, so that it is tokenized with
        the text that follows, as a plain run would read it: `...\n\n` then `Question` reads
        `\n`, `\n`, `Question`, not `\n\n`, `Question`."""
        if self.fixed_tail < 1 or self.fed >= len(self.token_ids) or self.overshoot is not None:
            return ""
        last = self.token_ids[-1]
        if last in self.backend.control_tokens.values():
            return ""
        data = self.backend.vocabulary.token_bytes[last] if 0 <= last else None
        try:
            text = data.decode("utf-8") if data else ""
        except UnicodeDecodeError:
            return ""
        if text:
            self.rollback(len(self.token_ids) - 1, "heal")
        return text

    def share(self) -> str:
        """Before the context is forked (Session.fork): feed all of it, so each fork starts
        from the logits after it (and after all but its last token, for a hole that heals
        it) instead of feeding the shared tokens again. Returns the text of the last token,
        taken back (take_tail): each fork, and this context after the forks, appends it
        first."""
        self.settle()
        if self.model is None or not self.token_ids:
            return ""  # an empty context: each fork begins as a run does
        tail = self.take_tail()
        if not self.token_ids:
            return tail
        self._drop_ahead()
        n = len(self.token_ids)
        if self.prefix_cache is not None and self.fed < n:
            self._from_prefix_cache()
        if self.fed < n:
            # The logits before the last token too, where a hole heals in context (a branch
            # that begins with a hole); one forward either way.
            heals = self.backend.capabilities.heals_in_context
            self._feed(min(2, n - self.fed) if heals else 1)
        if n not in self._known:
            self.next_logits()
        self.pause()  # the forks feed next, not this context (vLLM: its live request ends)
        return tail

    def fork(self, model: StepModel | None, stats: Stats, recorder: Recorder | None
             ) -> Session:
        """A new session whose context is a copy of this one's, its KV cache a fork of this
        one's (KVCache.fork: no position is fed again), fed through `model` and counted in
        `stats`. Call share() first: collected text and an overshoot are not carried over."""
        assert not self._stretch and self.overshoot is None, "share() the context first"
        cache = self._cache.fork() if self._cache is not None else None
        forked = Session(self.backend, model, stats, self.prefix_cache, recorder, cache)
        forked.token_ids = list(self.token_ids)
        forked.fed = self.fed
        forked.fixed_tail = self.fixed_tail
        forked.boundaries = set(self.boundaries)
        forked._known = dict(self._known)  # arrays never written in place: shared
        if recorder is not None:
            recorder.fixed(0, forked.token_ids)
        return forked

    def adopt(self, other: Session) -> None:
        """Go on from `other`'s context: a fork of this one (Session.fork) that ran on, a
        particles block's chosen particle (runtime/particle_block.py). Its token ids, KV
        cache, known logits, collected text and overshoot become this session's; this
        session's model, counters, recorder and prefix cache stay."""
        self._drop_ahead()
        other._drop_ahead()  # drafted tokens past its context (a branch that speculated)
        self.token_ids, self.fed, self.fixed_tail = other.token_ids, other.fed, other.fixed_tail
        self._cache, self._known, self.boundaries = other._cache, other._known, other.boundaries
        self._stretch, self.overshoot = other._stretch, other.overshoot

    def extend_fed(self, token_ids: Sequence[int], cache: KVCache,
                   logits: npt.NDArray[np.float32]) -> None:
        """Append tokens that were already fed elsewhere: `cache` holds the whole context with
        them (e.g. the winning row of a select batch) and `logits` follow them."""
        self._drop_ahead()
        assert self.fed == len(self.token_ids), "the context must be fed before it is extended"
        assert cache.length() == self.fed + len(token_ids)
        self.token_ids.extend(token_ids)
        self.cache = cache
        self.fed = len(self.token_ids)
        self.fixed_tail = 0
        self._known[self.fed] = logits

    def sync(self) -> None:
        """Make the KV cache cover the whole context: after logits came from the prefix cache
        the KV may lag behind, and a caller about to use the cache directly needs it whole."""
        self._drop_ahead()
        if self.fed < len(self.token_ids):
            self.forward(self.token_ids[self.fed :])
            self.fed = len(self.token_ids)

    def forward(self, token_ids: Sequence[int], logits_for: int = 1) -> npt.NDArray[np.float32]:
        """One counted, timed forward of `token_ids` on top of the cache."""
        if self.model is None:
            raise RuntimeError("this session has no model: its backend samples whole holes")
        started = time.perf_counter()
        logits = self.model.forward(token_ids, self.cache, logits_for)
        counts = self.cache.take_counts()
        computed, cached = counts if counts is not None else (len(token_ids), 0)
        self.count_model_call(time.perf_counter() - started, computed, cached)
        return logits

    def count_model_call(self, seconds: float, computed: int, cached: int = 0,
                         calls: int = 1) -> None:
        """Count `calls` model calls that took `seconds`, computed `computed` positions and
        served `cached` from the backend's own cache (every forward, scoring or completion)."""
        self.stats.model_s += seconds
        self.stats.forward_calls += calls
        self.stats.forward_tokens += computed
        self.stats.cached_tokens += cached

    def pause(self) -> None:
        """No logits are needed until more text comes (a hole has ended): see
        KVCache.release."""
        if self._cache is not None:
            self._cache.release()

    def close(self) -> None:
        """The run is over (finished or failed): let the backend free what it holds for this
        context, and take its last counts."""
        if self._cache is None:
            return
        self._drop_ahead()
        self._cache.release(wait=True)
        counts = self._cache.take_counts()
        if counts is not None:
            self.count_model_call(0.0, counts[0], counts[1], calls=0)
        # Let go of it now: a branch's run (runtime/branches.py) sits in reference cycles
        # that only the garbage collector ends, and a llama.cpp sequence is freed only with
        # its cache (64 particles of a block held 64 of the 256 until a collection).
        self._cache = None

    def rollback(self, length: int, reason: str = "rollback") -> None:
        """Truncate the context to its first `length` tokens, cropping the KV cache; positions
        dropped after being computed are counted in rollback_tokens. `reason` is what the trace
        says dropped them ("stop", "heal", "rollback")."""
        if length < 0 or length > len(self.token_ids):
            raise ValueError(f"cannot roll a {len(self.token_ids)}-token context back to {length}")
        self._drop_ahead()
        if length == len(self.token_ids):
            return
        self.fixed_tail = max(0, self.fixed_tail - (len(self.token_ids) - length))
        self.boundaries = {b for b in self.boundaries if b <= length}
        if self.recorder is not None:
            self.recorder.drop(length, reason)
        del self.token_ids[length:]
        if self.fed > length:
            self.stats.rollback_tokens += self.fed - length
            self.cache.crop(length)
            self.fed = length
        self._known = {n: v for n, v in self._known.items() if n <= length}

    def take_back(self, length: int, fixed_tail: int | None = None) -> None:
        """Return the context to its first `length` tokens, as it was when it had that many (a
        hidden block's start: runtime/contexts.py; a hidden call or a failed `try` body:
        runtime/calls.py): text collected since and a hole's pending overshoot go too, the KV
        cache is cropped and nothing is fed again. `fixed_tail`: the fixed-text tokens at its
        end as then (token healing may take them back), when the caller knows it."""
        self._stretch = Stretch()
        self.overshoot = None
        self.rollback(min(length, len(self.token_ids)), "rollback")
        if fixed_tail is not None:
            self.fixed_tail = fixed_tail

    def heal(self, count: int, keep_last: bool = False) -> bytes:
        """Take back the last `count` fixed-text tokens (token healing) and return their bytes,
        which the next hole must produce first. Unfed tokens cost nothing to take back.

        With `keep_last` (count 1), the token stays in the context for now: the hole decides
        with logits_before_last() and keeps it if the model writes that very token again."""
        self.settle()
        if count == 0:
            return b""
        vocab = self.backend.vocabulary
        removed = b"".join(vocab.token_bytes[t] or b"" for t in self.token_ids[-count:])
        if not keep_last:
            self.rollback(len(self.token_ids) - count, "heal")
        self.stats.healed_tokens += count
        return removed

    def finish(self) -> None:
        """Tokenize the text collected since the last hole, settle a pending overshoot and
        record the final context length."""
        self.settle()
        self.stats.context_tokens = len(self.token_ids)
