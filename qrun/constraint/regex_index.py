"""Token masks for regex constraints: a TokenIndex per (pattern, vocabulary), immutable and
shared through an IndexCache, and a MaskCursor per hole holding the DFA state. The executor asks
the cursor which token ids may come next and advances it with the sampled id."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from qrun.constraint.lru import Lru
from qrun.constraint.past import Past, rolled_back
from qrun.constraint.vocab import TokenTrie, Vocabulary
from qrun.regex.dfa import (
    UNREACHABLE,
    ByteDFA,
    compile_dfa,
    distances_to_accept,
)

__all__ = [
    "DEAD",
    "EAGER_MAX_STATES",
    "IllegalTokenError",
    "IndexCache",
    "MaskCursor",
    "TokenIndex",
]

# The state after an illegal token. ByteDFA numbers its dead state S; the index hides that.
DEAD = -1
# Masks of all states are computed at build time (one vectorised walk for all states together)
# when the DFA has at most this many states. Measured on SmolLM2 (bench/masks.py): date 0.3 ms,
# email 8 ms, 120-state 6-field JSON schema 20 ms; cost grows with the number of "dense"
# states (inside free strings: ~1.5 ms each). Bigger DFAs compute each state on first visit.
EAGER_MAX_STATES = 256
# Lazily computed masks kept per index (bigger DFAs only): ~49 KB each for SmolLM2, so at most
# ~50 MB per index, oldest evicted first (hits stay lock-free); eager indexes keep all theirs.
_LAZY_MASK_CACHE_SIZE = 1024
# allowed_within keeps, per state met near a budget's end, each token's distance-after (int16,
# 98 KB for SmolLM2); masks for any budget are then one comparison. LRU-bounded to ~12 MB.
_END_DIST_CACHE_SIZE = 128
# "Cannot finish" in those int16 distance arrays.
_FAR = np.iinfo(np.int16).max


class IllegalTokenError(ValueError):
    """A token id was advanced that the mask does not allow (a bug in the caller: the executor
    only samples allowed ids)."""


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class TokenIndex:
    """Which tokens each DFA state allows, for one (pattern, vocabulary). Immutable apart from
    memoised masks (guarded by a lock); share it between holes and sessions.

    Masks returned are shared bool arrays of shape [V], marked read-only (numpy raises on a
    write): copy one before changing it.
    Token t is allowed in state s iff walking t's bytes from s ends in a live state; EOS ids are
    allowed iff s is accepting (docs/internals.md §3.1). Special/added tokens are never allowed.
    """

    dfa: ByteDFA
    vocab: Vocabulary
    # Fewest tokens from each state to acceptance: exact (over the token transitions) when the
    # masks were built eagerly, else an upper bound from cutting a shortest byte path into
    # greedy longest tokens (docs/internals.md §3.8). int32 [S+1]; UNREACHABLE for dead.
    token_dist: npt.NDArray[np.int32]
    _max_token_dist: int
    _table: list[list[int]]
    # Per state: some token may follow (bool [S+1]); computed with the masks at build.
    _nonempty: npt.NDArray[np.bool_]
    _masks: OrderedDict[int, npt.NDArray[np.bool_]] = field(default_factory=OrderedDict)
    _eos_masks: dict[int, npt.NDArray[np.bool_]] = field(default_factory=dict)
    _end_dists: OrderedDict[int, tuple[npt.NDArray[np.int16], int]] = field(
        default_factory=OrderedDict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __repr__(self) -> str:
        return f"TokenIndex(pattern={self.dfa.pattern!r}, states={self.dfa.num_states})"

    @staticmethod
    def build(pattern: str | ByteDFA, vocab: Vocabulary,
              eager_max_states: int = EAGER_MAX_STATES) -> TokenIndex:
        """Compile `pattern` (or take a compiled DFA) and index it against `vocab`; the masks
        of all states are computed now when the DFA has at most `eager_max_states` states.

        Raises:
            PatternError: see compile_dfa.
        """
        dfa = compile_dfa(pattern) if isinstance(pattern, str) else pattern
        # can_continue per state: at the byte level every live state can continue; with
        # eagerly built masks it is exact for the vocabulary.
        nonempty = (dfa.transitions != dfa.dead).any(axis=1)
        masks: list[npt.NDArray[np.bool_]] = []
        if dfa.num_states <= eager_max_states:
            states = np.arange(dfa.num_states, dtype=np.int64)
            rows, token_ids, ends = _walk(vocab.trie, dfa, states)
            masks, any_token = _masks_from(rows, token_ids, len(states), vocab)
            nonempty[: len(states)] = any_token
            token_dist = _exact_token_dist(dfa, rows, ends)
        else:
            token_dist = _greedy_token_dist(dfa, vocab)
        token_dist.flags.writeable = False
        finite = token_dist[token_dist < UNREACHABLE]
        max_dist = int(finite.max()) if finite.size else 0
        table = dfa.transitions.tolist()
        index = TokenIndex(dfa, vocab, token_dist, max_dist, table, nonempty)
        for state, mask in enumerate(masks):
            index._masks[state] = mask
        return index

    @property
    def start_state(self) -> int:
        return self.dfa.start

    def start(self) -> MaskCursor:
        """A fresh cursor for one hole."""
        return MaskCursor(self, self.dfa.start)

    def is_accepting(self, state: int) -> bool:
        return state != DEAD and bool(self.dfa.accepting[state])

    def advance(self, state: int, token_id: int) -> int:
        """The state after `token_id`, or DEAD if the token is not allowed (EOS included)."""
        if state == DEAD or not 0 <= token_id < self.vocab.size:
            return DEAD
        data = self.vocab.token_bytes[token_id]
        return DEAD if data is None else self.advance_bytes(state, data)

    def advance_bytes(self, state: int, data: bytes) -> int:
        """The state after `data`, or DEAD."""
        if state == DEAD:
            return DEAD
        table = self._table
        for byte in data:
            state = table[state][byte]
        return DEAD if state == self.dfa.dead else state

    def allowed(self, state: int, eos: bool = True) -> npt.NDArray[np.bool_]:
        """Mask [V] of the tokens allowed in `state`; with `eos`, EOS ids are set when accepting."""
        if state == DEAD:
            return np.zeros(self.vocab.size, dtype=np.bool_)
        if eos and self.dfa.accepting[state]:
            cached = self._eos_masks.get(state)
            if cached is None:
                cached = self._with_eos(self.allowed(state, eos=False))
                with self._lock:
                    self._eos_masks[state] = cached
            return cached
        mask = self._masks.get(state)
        if mask is None:
            masks, any_token = self._compute([state])
            with self._lock:
                mask = self._masks.setdefault(state, masks[0])
                self._nonempty[state] = any_token[0]
                if len(self._masks) > max(_LAZY_MASK_CACHE_SIZE, EAGER_MAX_STATES):
                    self._masks.popitem(last=False)
        return mask

    def allowed_within(self, state: int, tokens_left: int, eos: bool = True
                       ) -> npt.NDArray[np.bool_]:
        """Like `allowed`, but only tokens after which the constraint can still be completed in
        `tokens_left - 1` more tokens (counting single-byte tokens, an upper bound on what is
        needed), so a hole running out of budget ends valid instead of truncated. EOS (when
        accepting) does not count against the budget.
        """
        if state == DEAD or tokens_left <= 0:
            mask = np.zeros(self.vocab.size, dtype=np.bool_)
            return self._with_eos(mask) if eos and self.is_accepting(state) else mask
        limit = tokens_left - 1
        if limit >= self._max_token_dist:
            return self.allowed(state, eos)
        end_dist, worst = self._end_dist(state)
        if limit >= worst:
            return self.allowed(state, eos)
        mask = end_dist <= limit
        return self._with_eos(mask) if eos and self.is_accepting(state) else mask

    def can_continue(self, state: int) -> bool:
        """Whether some token may follow (the hole need not end here)."""
        return state != DEAD and bool(self._nonempty[state])

    def _end_dist(self, state: int) -> tuple[npt.NDArray[np.int16], int]:
        """Per token: token_dist of the state after it (clipped to int16, _FAR if illegal), and
        the largest finite value. LRU-cached: only states met near a budget's end need it."""
        with self._lock:
            cached = self._end_dists.get(state)
            if cached is not None:
                self._end_dists.move_to_end(state)
                return cached
        _, token_ids, ends = _walk(self.vocab.trie, self.dfa, np.array([state], dtype=np.int64))
        dist = np.minimum(self.token_dist[ends], _FAR).astype(np.int16)
        end_dist = np.full(self.vocab.size, _FAR, dtype=np.int16)
        end_dist[token_ids] = dist
        for dup, rep in self.vocab.trie.duplicates:
            end_dist[dup] = end_dist[rep]
        finite = dist[dist < _FAR]
        result = (end_dist, int(finite.max()) if finite.size else 0)
        with self._lock:
            self._end_dists[state] = result
            if len(self._end_dists) > _END_DIST_CACHE_SIZE:
                self._end_dists.popitem(last=False)
        return result

    def _with_eos(self, mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        out = mask.copy()
        out[list(self.vocab.eos_token_ids)] = True
        out.flags.writeable = False  # cached and shared like the masks without EOS
        return out

    def _compute(self, states: list[int]
                 ) -> tuple[list[npt.NDArray[np.bool_]], npt.NDArray[np.bool_]]:
        rows, token_ids, _ = _walk(self.vocab.trie, self.dfa, np.array(states, dtype=np.int64))
        return _masks_from(rows, token_ids, len(states), self.vocab)


def _exact_token_dist(
    dfa: ByteDFA, rows: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    """Fewest tokens from each state to acceptance, by BFS over the state graph the vocabulary
    induces (an edge s -> s' when some token leads there; `rows`/`ends` from a walk of all
    states). Dense adjacency: only used for <= EAGER_MAX_STATES states."""
    n = dfa.dead + 1
    adjacent = np.zeros((n, n), dtype=np.bool_)
    adjacent[rows, ends] = True
    dist = np.full(n, UNREACHABLE, dtype=np.int32)
    frontier = dfa.accepting.copy()
    seen = frontier.copy()
    level = 0
    while frontier.any():
        dist[frontier] = level
        frontier = adjacent[:, frontier].any(axis=1) & ~seen
        seen |= frontier
        level += 1
    return dist


def _greedy_token_dist(dfa: ByteDFA, vocab: Vocabulary) -> npt.NDArray[np.int32]:
    """An upper bound on the fewest tokens to acceptance without walking every state: follow a
    shortest byte path and cut it greedily into the longest vocabulary tokens (a real token
    path, so the bound is safe). Forced JSON keys like `", "age": ` count as ~3 tokens instead
    of 9 bytes. Falls back to single-byte tokens where that is smaller."""
    table, dist = dfa.transitions, dfa.dist
    n = dfa.dead + 1
    bound = distances_to_accept(table, dfa.accepting, vocab.single_byte_tokens)
    on_path = dist[table] == dist[:, None] - 1  # [n, 256]: bytes that keep a shortest path
    next_byte = np.argmax(on_path, axis=1)
    for state in np.argsort(dist[:-1], kind="stable").tolist():
        if dist[state] == 0 or dist[state] >= UNREACHABLE:
            continue
        path = bytearray()
        states = []
        cur = state
        best = 0
        while dist[cur] > 0 and len(path) < vocab.max_token_len:
            byte = int(next_byte[cur])
            path.append(byte)
            cur = int(table[cur, byte])
            states.append(cur)
            prefix = bytes(path)
            if vocab.is_token(prefix):
                best = len(path)
            if not vocab.has_extension(prefix):
                break
        if best:
            # states[best - 1] is nearer acceptance, so its bound is already final.
            bound[state] = min(int(bound[state]), 1 + int(bound[states[best - 1]]))
    bound[n - 1] = UNREACHABLE
    return bound


def _masks_from(
    rows: npt.NDArray[np.int64], token_ids: npt.NDArray[np.int64], n: int, vocab: Vocabulary
) -> tuple[list[npt.NDArray[np.bool_]], npt.NDArray[np.bool_]]:
    """Bool masks [V] (views into one [n, V] array) from _walk's allowed pairs, and whether
    each is non-empty. Masks are numpy, not torch: torch's `.any()` on a [V] tensor had a
    20 µs median but 12-16 ms outliers on the 2-core VM under load (intra-op thread pool);
    numpy's stays near 10 µs."""
    masks = np.zeros((n, vocab.size), dtype=np.bool_)
    masks[rows, token_ids] = True
    for dup, rep in vocab.trie.duplicates:
        masks[:, dup] = masks[:, rep]
    masks.flags.writeable = False  # shared through the index's cache
    return list(masks), np.asarray(masks.any(axis=1), dtype=np.bool_)


def _walk(
    trie: TokenTrie, dfa: ByteDFA, sources: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Walk every token through the DFA from each source state at once, level by level over the
    trie, keeping only (node, source) pairs that are still live: a rejected byte prunes the
    whole subtree, so sparse states (digits) cost a few levels and dense ones (inside a JSON
    string, ~49k tokens) one pass over the ~100k trie nodes.

    Returns (row, token_id, end_state) for every allowed pair, row indexing `sources`.
    """
    table = dfa.transitions.reshape(-1).astype(np.int64)
    dead = dfa.dead
    node = np.zeros(len(sources), dtype=np.int64)
    row = np.arange(len(sources), dtype=np.int64)
    cur = sources.astype(np.int64)
    out_rows, out_tokens, out_ends = [], [], []
    for depth in range(1, trie.max_len + 1):
        count = trie.child_count[depth - 1][node]
        total = int(count.sum())
        if total == 0:
            break
        parent = np.repeat(np.arange(len(node)), count)
        offset = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        child = trie.child_start[depth - 1][node][parent] + offset
        nxt = table[cur[parent] * 256 + trie.byte[depth][child]]
        live = nxt != dead
        node, row, cur = child[live], row[parent[live]], nxt[live]
        token = trie.token_at[depth][node]
        hit = token >= 0
        out_rows.append(row[hit])
        out_tokens.append(token[hit])
        out_ends.append(cur[hit])
    if not out_rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return np.concatenate(out_rows), np.concatenate(out_tokens), np.concatenate(out_ends)


class MaskCursor:
    """Where one hole is inside its constraint: the current DFA state over a shared TokenIndex,
    and the states before it (past.py; a DFA cannot go back by itself: `rollback`). Mutable
    and cheap; one per hole (fork with `copy`)."""

    __slots__ = ("index", "state", "past")

    def __init__(self, index: TokenIndex, state: int, past: Past = None) -> None:
        self.index = index
        self.state = state
        self.past = past

    def copy(self) -> MaskCursor:
        return MaskCursor(self.index, self.state, self.past)

    def allowed(self, tokens_left: int | None = None, eos: bool = True) -> npt.NDArray[np.bool_]:
        """Mask [V] of the ids that may come next (EOS ids when the constraint accepts); with
        `tokens_left`, only ids that keep a full match reachable within that many tokens
        (see TokenIndex.allowed_within). Shared: do not modify in place."""
        if tokens_left is None:
            return self.index.allowed(self.state, eos)
        return self.index.allowed_within(self.state, tokens_left, eos)

    def can_continue(self) -> bool:
        """Whether some token may still follow (False: the value is complete)."""
        return self.index.can_continue(self.state)

    def can_end(self) -> bool:
        """Whether the text so far is a full match (the hole may end here)."""
        return self.index.is_accepting(self.state)

    def advance(self, token_id: int) -> None:
        """Consume a sampled token.

        Raises:
            IllegalTokenError: the token is not allowed in the current state.
        """
        if not self.consume(token_id):
            raise IllegalTokenError(f"token id {token_id} is not allowed in state {self.state}")

    def consume(self, token_id: int) -> bool:
        """Consume `token_id` if allowed; False (and no change) if not (EOS included)."""
        nxt = self.index.advance(self.state, token_id)
        if nxt == DEAD:
            return False
        self.state, self.past = nxt, (self.state, self.past)
        return True

    def advance_bytes(self, data: bytes) -> None:
        """Consume bytes fed by other means (forced bytes, a token-healing prefix): one step
        for `rollback`, as a token is.

        Raises:
            IllegalTokenError: the bytes leave the constraint's language.
        """
        nxt = self.index.advance_bytes(self.state, data)
        if nxt == DEAD:
            raise IllegalTokenError(f"bytes {data!r} are not allowed in state {self.state}")
        self.state, self.past = nxt, (self.state, self.past)

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` steps (tokens consumed, or byte feeds).

        Raises:
            ValueError: more steps than were taken (no change then), or a negative count.
        """
        self.state, self.past = rolled_back(self.state, self.past, tokens)

    def forced_bytes(self) -> bytes:
        """Bytes every completion must continue with (fast-forward; docs/internals.md §6.1)."""
        return b"" if self.state == DEAD else self.index.dfa.forced_bytes(self.state)

    def accepts(self, data: bytes) -> bool:
        """Whether `data`, read from the constraint's start, is a full match."""
        index = self.index
        return index.is_accepting(index.advance_bytes(index.dfa.start, data))

    def min_bytes_to_accept(self) -> int:
        """Fewest bytes still needed for a full match (0 when accepting)."""
        return self.index.dfa.dist_to_accept(self.state if self.state != DEAD else -1)


class IndexCache:
    """A bounded LRU of TokenIndex objects keyed by (vocabulary, pattern), owned by whoever
    runs programs (one per backend). Thread-safe; building happens under the lock so two
    threads never compile the same pattern twice."""

    def __init__(self, max_entries: int = 64) -> None:
        if max_entries < 1:
            raise ValueError("IndexCache needs max_entries >= 1")
        self._entries: Lru[tuple[Vocabulary, str, bytes], TokenIndex] = Lru(max_entries)

    def get(self, pattern: str, vocab: Vocabulary, prefix: bytes = b"") -> TokenIndex:
        """The index over `vocab` of `prefix` followed by a match of `pattern` (see
        compile_dfa), built on first use.

        Raises:
            PatternError: see compile_dfa.
        """
        return self._entries.get_or_build(
            (vocab, pattern, prefix),
            lambda: TokenIndex.build(compile_dfa(pattern, prefix), vocab))

    def __len__(self) -> int:
        return len(self._entries)
