"""Token masks from llguidance for json= and grammar= holes: an LlgIndex is one grammar
(qrun/constraint/grammar/text.py text) compiled for one Vocabulary, immutable and shared through an
LlgCache; an LlgCursor is one hole's parser state and implements the hole Cursor protocol
(runtime/hole.py) as masks.py's MaskCursor does for regexes.

llguidance sees qrun's own token bytes (Vocabulary), never a Hugging Face tokenizer, so
healing, stop strings and fast-forward work on the same bytes as the regex engine. Masks are
byte-level (the grammar's `no_forcing` option): any tokenization of an allowed text is
allowed. llguidance has no token budget: LlgCursor adds one (`allowed(tokens_left)`).
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import llguidance
import numpy as np
import numpy.typing as npt

from qrun.collector import collector_paused
from qrun.constraint.grammar import (
    FIXED,
    GrammarError,
    JsonFormat,
    check_schema,
    clean_reason,
    schema_grammar,
)
from qrun.constraint.grammar.build_thread import built
from qrun.constraint.grammar.limits import DEFAULT, ConstraintLimits
from qrun.constraint.lru import Lru
from qrun.constraint.vocab import Vocabulary, byte_token_ids

__all__ = ["LlgCache", "LlgCursor", "LlgIndex", "greedy_tokens", "llg_tokenizer"]

# Budgets: a cursor estimates how many tokens a shortest completion needs (a greedy walk, see
# LlgCursor.completion) every _BUDGET_EVERY tokens, and at every token once the budget is
# within _BUDGET_WINDOW tokens of the estimate.
_BUDGET_EVERY = 8
_BUDGET_WINDOW = 16
# One token can lengthen the shortest completion (an opening `[{"` ...): closing starts this
# many tokens before the estimate says it must.
_BUDGET_MARGIN = 4
# The completion walk gives up after this many bytes (masks then ignore the budget), and
# takes another byte after the same one at most this many times running (a URI scheme
# accepts `0` forever).
_MAX_COMPLETION = 512
_MAX_REPEAT = 4
# Where at most _CHOICES bytes may come, the completion walk tries each of them. A walk that
# cycles (its last bytes one block repeated _CYCLE_REPEATS times) gives way to a search that
# expands at most _SEARCH_NODES states and tries at most _SEARCH_STEPS bytes in all.
_CHOICES = 8
_SEARCH_NODES = 400
_SEARCH_STEPS = 4000
_CYCLE_REPEATS = 12
# Bytes the completion walk prefers, in order: close strings and containers first, then a
# space (it ends a word in most grammars), then the shortest values. Any other allowed byte
# comes after these, lowest first, blanks last. A blank is never taken right after a blank
# when another byte may come: where JSON's layout is flexible a blank is allowed almost
# everywhere, and the walk would take blanks until it gives up.
_CLOSING_ORDER = b'"}]) 0,:nte1'
_BLANKS = frozenset(b" \t\n\r")
# Characters of grammar text an LlgCache keeps compiled (LlgCache says why): about 50 MB.
_MAX_GRAMMAR_CHARS = 1_000_000


class _TokenSource(llguidance.TokenizerWrapper):
    """What llguidance's LLTokenizer reads from a tokenizer object: per-id bytes, EOS,
    special ids, and an encoder (only used for canonical forcing, which qrun's grammars turn
    off, so greedy longest match is enough). TokenizerWrapper's own constructor wraps a
    guidance tokenizer, hence not called."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.is_tokenizer_wrapper = True
        # Special and padding ids have no bytes: llguidance names them `<[id]>` and prefixes
        # them with byte 0xFF, so they never match grammar text.
        self.tokens = [data if data is not None else f"<[{i}]>".encode()
                       for i, data in enumerate(vocab.token_bytes)]
        self.special_token_ids = [i for i, data in enumerate(vocab.token_bytes) if data is None]
        if vocab.eos_token_ids:
            self.eos_token_id = vocab.eos_token_ids[0]
        else:  # llguidance needs an EOS: one past the vocabulary, never in a returned mask
            self.eos_token_id = len(self.tokens)
            self.tokens.append(b"<[eos]>")
            self.special_token_ids.append(self.eos_token_id)
        self.bos_token_id = None
        self.greedy: llguidance.LLTokenizer | None = None

    def __call__(self, text: str | bytes) -> list[int]:
        if self.greedy is None:
            return []
        data = text if isinstance(text, str) else text.decode("utf-8", errors="replace")
        return list(self.greedy.greedy_tokenize(data))


@functools.lru_cache(maxsize=8)
def llg_tokenizer(vocab: Vocabulary) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for `vocab`, built once per vocabulary (~0.3 s for SmolLM2's
    49,152 tokens; Vocabulary hashes by identity)."""
    source = _TokenSource(vocab)
    eos = list(vocab.eos_token_ids) or [source.eos_token_id]
    tokenizer = llguidance.LLTokenizer(source, eos_token=eos)
    source.greedy = tokenizer
    return tokenizer


@functools.lru_cache(maxsize=8)
def _ordinary(vocab: Vocabulary) -> npt.NDArray[np.bool_]:
    """Ids a hole may produce: tokens with bytes, and EOS. A grammar naming a special token
    (`<[0]>`) still never gets it into a value."""
    out = np.array([data is not None for data in vocab.token_bytes], dtype=np.bool_)
    out[list(vocab.eos_token_ids)] = True
    return out


@functools.lru_cache(maxsize=8)
def _byte_tokens(vocab: Vocabulary) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                             npt.NDArray[np.int64]]:
    """Per byte its single-byte token (-1: none; vocab.py byte_token_ids); the bytes that
    have one, and those tokens (the completion walk reads the mask at these ids). Per
    vocabulary, not per grammar."""
    tokens = byte_token_ids(vocab)
    spelled = np.flatnonzero(tokens >= 0)
    ids = tokens[spelled]
    for array in (spelled, ids):
        array.flags.writeable = False
    return tokens, spelled, ids


class LlgIndex:
    """One grammar compiled for one vocabulary. `start()` hands out cursors: copies of a fresh
    matcher that share its lexer cache (llguidance guards it with a mutex), so later holes
    reuse the lexer states earlier ones built."""

    def __init__(self, grammar: str, vocab: Vocabulary, limits: ConstraintLimits = DEFAULT,
                 kept: bool = False) -> None:
        """Compile `grammar`, with llguidance's parser limits for `limits` (the ones it was
        checked against: a larger optional_properties needs larger parser rows). `kept`: a
        cache will keep it (LlgCache): it builds in the build thread for those
        (build_thread.py says why).

        Raises:
            GrammarError: llguidance refused it (its reason; grammar/text.py locates it).
        """
        self.grammar = grammar
        self.vocab = vocab
        self.tokenizer = llg_tokenizer(vocab)
        self.ordinary = _ordinary(vocab)
        self._template = built(lambda: llguidance.LLMatcher(  # build_thread.py says why
            self.tokenizer, grammar, log_level=0, limits=limits.parser_limits()), kept)
        if self._template.is_error():
            raise GrammarError(clean_reason(self._template.get_error()))
        self._lock = threading.Lock()
        self.byte_tokens, self.spelled_bytes, self.spelled_ids = _byte_tokens(vocab)

    def __repr__(self) -> str:
        return f"LlgIndex({len(self.grammar)} chars, vocab={self.vocab.size})"

    def start(self) -> LlgCursor:
        """A fresh cursor for one hole."""
        with self._lock:
            matcher = self._template.deep_copy()
        return LlgCursor(self, matcher)

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a complete text of the grammar (tokenization does not matter)."""
        cursor = self.start()
        return cursor.advance_bytes(data) and cursor.can_end()

    def tokens_for(self, data: bytes) -> list[int] | None:
        """Tokens spelling `data` (see greedy_tokens)."""
        return greedy_tokens(self.vocab, data)


def greedy_tokens(vocab: Vocabulary, data: bytes) -> list[int] | None:
    """Tokens spelling `data`, greedy longest match; None when some byte is in no token (a
    byte-level vocabulary may lack bytes UTF-8 text rarely holds: SmolLM2 has no token for
    0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2 or 0xF5-0xFF)."""
    out: list[int] = []
    pos = 0
    while pos < len(data):
        best, size = 0, 1
        while pos + size <= len(data):  # grow while some token starts with the piece
            piece = data[pos:pos + size]
            if vocab.is_token(piece):
                best = size
            if not vocab.has_extension(piece):
                break
            size += 1
        if not best:
            return None
        out.append(vocab.ids_of(data[pos:pos + best])[0])
        pos += best
    return out


class LlgCursor:
    """Where one hole is inside an llguidance grammar. Mutable; fork with `copy`."""

    __slots__ = ("index", "matcher", "_words", "_mask_cache", "_need", "_since", "_tail",
                 "_margin", "_way")

    def __init__(self, index: LlgIndex, matcher: llguidance.LLMatcher) -> None:
        self.index = index
        self.matcher = matcher
        self._words = np.zeros((index.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        self._mask_cache: npt.NDArray[np.bool_] | None = None
        # Tokens the shortest completion needed when last estimated (None: not yet, or the
        # walk found none), tokens consumed since, and the last bytes consumed.
        self._need: int | None = None
        self._since = 0
        self._tail = b""
        # Tokens before the estimated end at which closing starts: _BUDGET_MARGIN, raised to
        # the largest rise of the estimate seen in one step (an array of objects whose items
        # each need ten tokens more).
        self._margin = _BUDGET_MARGIN
        # The rest of the last completion computed, while the tokens consumed since followed
        # it (the closing tokens do): the walk from here would find it again.
        self._way: bytes | None = None

    def copy(self) -> LlgCursor:
        twin = LlgCursor(self.index, self.matcher.deep_copy())
        twin._need, twin._since, twin._tail = self._need, self._since, self._tail
        twin._margin, twin._way = self._margin, self._way
        return twin

    def allowed(self, tokens_left: int | None = None) -> npt.NDArray[np.bool_]:
        """Bool mask [V] of the ids that may come next, EOS ids included where the text so
        far is complete. With `tokens_left`, near the end of the budget only the first token
        of a shortest completion (or EOS where complete) is allowed, so the value ends
        complete instead of cut off (see `_closing_token`). Read-only, as MaskCursor's are
        (the mask cached until the state changes): the runtime copies a mask it changes
        (runtime/generate.py), so a fresh copy at every step would be waste."""
        if tokens_left is not None:
            closing = self._closing_token(tokens_left)
            if closing is not None:
                only = np.zeros(self.index.vocab.size, dtype=np.bool_)
                only[closing] = True
                return only
        return self.mask()

    def can_end(self) -> bool:
        """The text so far is complete (EOS may come next)."""
        return not self.matcher.is_error() and self.matcher.is_accepting()

    def can_continue(self) -> bool:
        """Some token other than EOS may still come."""
        if self.matcher.is_error() or self.matcher.is_stopped():
            return False
        mask = self.mask()
        eos = list(self.index.vocab.eos_token_ids)
        return int(np.count_nonzero(mask)) > int(np.count_nonzero(mask[eos]))

    def advance(self, token_id: int) -> None:
        """Consume a token the mask allowed.

        Raises:
            ValueError: it was not allowed (the cursor is then unusable); GrammarError (a
                ValueError) where llguidance's parser stopped.
        """
        if not self.index.ordinary[token_id]:
            raise ValueError(f"token id {token_id} is a special token")
        self._mask_cache = None
        if not self.matcher.consume_token(token_id):
            # Masks allow only tokens llguidance takes, so this is its parser giving up (its
            # row limit: "Current row has 20001 items"): the run fails at the hole with it.
            reason = clean_reason(self.matcher.get_error())[:300]
            raise GrammarError(f"llguidance's parser stopped at token id {token_id}: {reason}")
        self._since += 1
        data = self.index.vocab.token_bytes[token_id] or b""
        self._tail = (self._tail + data)[-_MAX_REPEAT:]
        way = self._way
        self._way = way[len(data):] if way is not None and way.startswith(data) else None

    def consume(self, token_id: int) -> bool:
        """Consume `token_id` if allowed; False (and no change) if not."""
        if (self.matcher.is_error() or not self.index.ordinary[token_id]
                or self.matcher.validate_tokens([token_id]) != 1):
            return False
        self.advance(token_id)
        return True

    def advance_bytes(self, data: bytes) -> bool:
        """Consume bytes as greedy longest-match tokens (masks are byte-level, so any
        tokenization gives the same state); False when they leave the language or no token
        spells them (the tokens before the one refused stay consumed)."""
        tokens = self.index.tokens_for(data)
        return tokens is not None and all(self.consume(token) for token in tokens)

    def accepts(self, data: bytes) -> bool:
        """Whether `data`, read from the grammar's start, is a complete text."""
        return self.index.accepts(data)

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` consumed tokens.

        Raises:
            ValueError: more tokens than were consumed, or a negative count.
        """
        if tokens < 0:
            raise ValueError(f"cannot roll back {tokens} tokens")
        self._mask_cache, self._need, self._tail, self._way = None, None, b"", None
        if tokens and not self.matcher.rollback(tokens):
            raise ValueError(f"cannot roll back {tokens} tokens: "
                             f"{clean_reason(self.matcher.get_error())[:300]}")

    def reset(self) -> None:
        self._mask_cache, self._need, self._tail, self._way = None, None, b"", None
        self.matcher.reset()

    def forced_bytes(self) -> bytes:
        """Bytes every completion continues with (fast-forward, runtime/generate.py)."""
        if self.matcher.is_error():
            return b""
        return bytes(self.matcher.compute_ff_bytes())

    def completion(self, look_ahead: bool = True) -> bytes | None:
        """A short text that completes the value from here, or None when none is found.
        First a greedy walk: forced bytes; else, where at most _CHOICES bytes may come (an
        enum's first byte, which listed property next), the one whose own greedy completion
        is shortest (`look_ahead`); else the first allowed byte of _CLOSING_ORDER, else the
        lowest allowed byte (never the same byte more than `_MAX_REPEAT` times running). A
        walk that cycles (a grammar's list with no closing byte) gives way to a bounded
        breadth-first search (`look_ahead` only)."""
        walker = self.copy()
        out = bytearray()
        while not walker.can_end():
            forced = walker.forced_bytes()
            step = forced if forced else walker.cheapest_byte(look_ahead)
            if not step or len(out) + len(step) > _MAX_COMPLETION or _cycling(out):
                return self._search() if look_ahead else None
            if not walker.advance_bytes(step):
                return None
            out += step
        return bytes(out)

    def _search(self) -> bytes | None:
        """The completion with the fewest choices among the states met breadth-first, or None:
        forced bytes count as one step, every allowed byte is tried (preferred ones first),
        and a state whose mask is one already met is not expanded again, so the many bytes
        that leave a value where it was (an email's local part allows ~80, of which only
        `@` leads on) cost one look each. Bounded by _SEARCH_NODES states expanded and
        _SEARCH_STEPS bytes tried."""
        start = self.copy()
        seen = {start._fingerprint()}
        frontier: deque[tuple[LlgCursor, bytes]] = deque([(start, b"")])
        tried = 0
        for _ in range(_SEARCH_NODES):
            if not frontier:
                break
            cursor, text = frontier.popleft()
            forced = cursor.forced_bytes()
            steps = [forced] if forced else [bytes([b]) for b in cursor.candidates(None)]
            for step in steps:
                tried += 1
                if tried > _SEARCH_STEPS:
                    return None
                child = cursor.copy()
                if len(text) + len(step) > _MAX_COMPLETION or not child.advance_bytes(step):
                    continue
                if child.can_end():
                    return text + step
                key = child._fingerprint()
                if key not in seen:
                    seen.add(key)
                    frontier.append((child, text + step))
        return None

    def _fingerprint(self) -> bytes:
        """What the search tells states apart by: the mask (two states that allow the same
        tokens now are taken as one; at worst this finds a longer completion, or none, and
        the budget then closes the value earlier or not at all, as before)."""
        return hashlib.blake2b(self.mask().tobytes(), digest_size=16).digest()

    def candidates(self, limit: int | None = _CHOICES) -> list[int]:
        """The bytes that may come next (single-byte tokens), preferred ones first, at most
        `limit` (None: all)."""
        allowed = self._next_bytes()
        preferred = [b for b in _CLOSING_ORDER if b in allowed]
        return [*preferred, *(b for b in allowed if b not in preferred)][:limit]

    def cheapest_byte(self, look_ahead: bool = False) -> bytes:
        """The byte the completion walk takes next (see `completion`), b"" when none."""
        recent = self._tail
        stuck = len(recent) == _MAX_REPEAT and len(set(recent)) == 1
        allowed = [b for b in self._next_bytes() if not (stuck and b == recent[0])]
        solid = [b for b in allowed if b not in _BLANKS]
        if look_ahead and 2 <= len(allowed) <= _CHOICES:
            # A blank only delays what follows it: weigh the other bytes when there are any.
            best, best_size = b"", _MAX_COMPLETION + 1
            for byte in solid if len(solid) >= 2 else allowed:
                trial = self.copy()
                rest = (trial.completion(look_ahead=False)
                        if trial.advance_bytes(bytes([byte])) else None)
                if rest is not None and len(rest) < best_size:
                    best, best_size = bytes([byte]), len(rest)
            if best:
                return best
        after_blank = bool(recent) and recent[-1] in _BLANKS
        for byte in _CLOSING_ORDER:
            if byte in allowed and not (after_blank and byte in _BLANKS and solid):
                return bytes([byte])
        return bytes((solid or allowed)[:1])

    def _next_bytes(self) -> list[int]:
        """The bytes whose single-byte token the mask allows, lowest first."""
        index = self.index
        allowed: list[int] = index.spelled_bytes[self.mask()[index.spelled_ids]].tolist()
        return allowed

    def _closing_token(self, tokens_left: int) -> int | None:
        """The token to force near the end of the budget, or None to leave the mask whole.
        The shortest completion is re-estimated every `_BUDGET_EVERY` tokens, and at every
        token once the budget is within `_BUDGET_WINDOW` of the estimate; once within
        the margin (_BUDGET_MARGIN, raised by the rises seen), only the completion's first token
        is allowed, or EOS where the text is complete."""
        if self.matcher.is_error():
            return None
        if self.can_end():
            # A complete text this close to the end ends: one more token could start a
            # part (an optional clause) that no longer fits.
            eos = self.index.vocab.eos_token_ids
            return eos[0] if eos and tokens_left <= self._margin else None
        stale = self._need is None or self._since >= _BUDGET_EVERY
        window = _BUDGET_WINDOW + self._margin
        if not stale and self._need is not None and tokens_left > self._need + window:
            return None
        completion = self._way if self._way is not None else self.completion()
        self._way = completion
        if completion is None:
            self._need = None
            return None
        tokens = self._tokenize(completion)
        if self._need is not None:
            rise = len(tokens) - (self._need - self._since)
            self._margin = max(self._margin, rise + 1)
        self._need, self._since = len(tokens), 0
        return tokens[0] if tokens and len(tokens) + self._margin >= tokens_left else None

    def _tokenize(self, data: bytes) -> Sequence[int]:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self.index.tokens_for(data) or []
        return list(self.index.tokenizer.greedy_tokenize(text))

    def mask(self) -> npt.NDArray[np.bool_]:
        """The current mask as a bool array [V] (all False in the error state), cached until
        the state changes: read-only."""
        if self._mask_cache is not None:
            return self._mask_cache
        size = self.index.vocab.size
        if self.matcher.is_error():
            return np.zeros(size, dtype=np.bool_)
        words = self._words
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:size].view(np.bool_)
        mask = bits & self.index.ordinary
        mask.flags.writeable = False  # handed out until the state changes
        self._mask_cache = mask
        return mask


def _cycling(out: bytearray) -> bool:
    for size in range(2, 17):
        span = size * _CYCLE_REPEATS
        if len(out) >= span and out[-span:] == out[-size:] * _CYCLE_REPEATS:
            return True
    return False


class LlgCache:
    """A bounded LRU of LlgIndex objects keyed by (vocabulary, grammar text), one per backend
    (runtime/constraints.py). Thread-safe; building happens under the lock so two threads
    never compile the same grammar at once.

    A grammar is kept from its second use (lru.py keep_from_second_use): the first time, the
    index is shared while its users hold it and goes with them. Why: compiled grammars kept
    alive slow llguidance's next compiles, by scattering its allocations through the build
    thread's malloc arena (build_thread.py); a Kubernetes schema of MaskBench built in 13.2 ms
    with none kept, 14.8 with 5 and 16 with 20 (one process, interleaved); the whole suite's
    first-mask p99 was 19.5 and 21.1 ms keeping every grammar, 17.2 and 17.9 keeping them from
    their second use (interleaved runs of bench/maskbench.py), and 16.0 building those in a
    thread of their own. A grammar used again costs one more compile, once.

    Bounded in number and in memory: at most `max_grammar_chars` characters of grammar in
    all (but the newest grammar, whatever its size). A compiled grammar holds about 50 times
    its text: 64 of MaskBench's large schemas took 131 MB for 2.7 MB of text."""

    def __init__(self, max_entries: int = 64, max_grammar_chars: int = _MAX_GRAMMAR_CHARS
                 ) -> None:
        self._entries: Lru[tuple[Vocabulary, str, ConstraintLimits], LlgIndex] = Lru(
            max(1, max_entries), max(1, max_grammar_chars), lambda key: len(key[1]),
            keep_from_second_use=True)
        # Grammar texts of the schemas `schema` met, per schema value and layout: a schema met
        # again skips the rewrite (a deep copy and walks, up to ~10 ms on MaskBench's largest).
        self._texts: Lru[tuple[bytes, JsonFormat, ConstraintLimits], str] = Lru(
            max(1, max_entries))

    def schema(self, schema: Any, vocab: Vocabulary, fmt: JsonFormat = FIXED,
               limits: ConstraintLimits = DEFAULT, locate: bool = True) -> LlgIndex:
        """The index of a JSON Schema (a dict or a bool) in layout `fmt`, compiled once:
        building the index is llguidance's check, so a schema that compiles costs one
        compile, with the tokenizer (check_schema and then `get` cost two: one without a
        tokenizer to check, one to build; lower() does the first). Only a refused schema is
        compiled again, by check_schema, to locate the fault (`locate=False`: not, for a
        caller that locates it itself: qrun.Matcher through lower()). Issue #24 item 4.

        Raises:
            GrammarError: the schema is refused (with its JSON pointer where found).
        """
        with collector_paused():  # text.py: the rewrite's allocations, and the compile
            try:
                # The schema's value as bytes: marshal's version 0 writes equal values alike
                # (no references, no interning marks) and takes 0.19 ms where json.dumps
                # takes 0.68 (a Kubernetes schema of MaskBench: 157 KB, two thirds prose).
                key: tuple[bytes, JsonFormat, ConstraintLimits] | None = (
                    marshal.dumps(schema, 0), fmt, limits)
            except ValueError:  # not plain data, or nested too deeply: schema_grammar says
                key = None
            grammar = self._texts.get(key) if key is not None else None
            if grammar is None:
                grammar = schema_grammar(schema, fmt, limits)
                if key is not None:
                    self._texts.put(key, grammar)
        try:
            with collector_paused():
                return self.get(grammar, vocab, limits)
        except GrammarError as exc:
            if not locate:
                raise
            located = check_schema(schema, fmt, limits)
            raise (located if located is not None else exc) from None

    def get(self, grammar: str, vocab: Vocabulary, limits: ConstraintLimits = DEFAULT
            ) -> LlgIndex:
        """The index of `grammar` over `vocab` under `limits`, built on first use.

        Raises:
            GrammarError: llguidance refused the grammar.
        """
        return self._entries.get_or_build((vocab, grammar, limits),
                                          lambda: LlgIndex(grammar, vocab, limits),
                                          lambda: LlgIndex(grammar, vocab, limits, kept=True))
