"""Regex -> byte-level DFA: the automaton every token mask is computed from
(qrun/constraint/regex_index.py walks the vocabulary through `ByteDFA.transitions`). The front end
(syntax.py) gives an AST with qrun's meaning applied; here it becomes a Thompson NFA over UTF-8 byte
ranges, then a DFA by subset construction over byte classes, pruned to co-reachable states and
minimised."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qrun.regex.charset import NEWLINE, Ranges, utf8_sequences
from qrun.regex.syntax import Alt, Anchor, Chars, Node, PatternError, Repeat, Seq, parse

__all__ = [
    "DFA_MAX_STATES",
    "NFA_MAX_STATES",
    "UNREACHABLE",
    "ByteDFA",
    "compile_dfa",
    "distances_to_accept",
    "edge_distances",
]

# Subset construction stops here: masks are memoised per state and a 20k-state DFA already
# means ~1 GB of bool masks if all were visited. Real constraints are far smaller (a 7-field
# JSON schema with an email field: 829 states, docs/internals.md §3.7).
DFA_MAX_STATES = 20_000
# Bounded repeats are unrolled (`\d{1,5000}` makes 5000 copies); this caps that blow-up before
# subset construction starts.
NFA_MAX_STATES = 200_000

# Modes of an NFA state inside a DFA state (encoded as nfa_state * 3 + mode): NORMAL may read
# any byte; ENDED sits after `\Z`/`$` and may read nothing; NL_PENDING sits after `$` when the
# rest of the input is exactly "\n" (Python's `$` also matches before a final newline).
_NORMAL, _ENDED, _NL_PENDING = 0, 1, 2


# ---------------------------------------------------------------------------------------------
# The DFA


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class ByteDFA:
    """A complete DFA over bytes for `prefix` followed by a match of `pattern` (minimal when
    there is no prefix).

    transitions: int32 [S+1, 256]; row S (== `dead`) is the dead state and maps to itself.
        Every state 0..S-1 is reachable from `start` and can reach acceptance (co-reachability),
        so "next state != dead" means "the input so far is a prefix of some match".
    accepting: bool [S+1]; accepting[dead] is False.
    dist: int32 [S+1], fewest bytes from each state to acceptance (dead: a huge value).
    All arrays are read-only.
    """

    pattern: str
    prefix: bytes
    transitions: npt.NDArray[np.int32]
    accepting: npt.NDArray[np.bool_]
    start: int
    dist: npt.NDArray[np.int32]
    # Per state: the only live out-byte, or -1 when there are zero or several (precomputed for
    # forced_bytes, which fast-forward calls at every step).
    _single_byte: npt.NDArray[np.int16]

    def __repr__(self) -> str:
        prefix = f", prefix={self.prefix!r}" if self.prefix else ""
        return f"ByteDFA(pattern={self.pattern!r}{prefix}, states={self.num_states})"

    @property
    def dead(self) -> int:
        return int(self.transitions.shape[0]) - 1

    @property
    def num_states(self) -> int:
        """Live states, not counting the dead state."""
        return self.dead

    def step(self, state: int, data: bytes) -> int:
        """The state after reading `data` from `state` (`dead` once no match is possible)."""
        table = self.transitions
        for byte in data:
            state = int(table[state, byte])
        return state

    def matches(self, data: bytes) -> bool:
        """Whether `data` is in the language (full match)."""
        return bool(self.accepting[self.step(self.start, data)])

    def dist_to_accept(self, state: int) -> int:
        """Fewest bytes that take `state` to an accepting state (0 when accepting)."""
        return int(self.dist[state])

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every match must continue with from `state`: follow the chain while the state
        is not accepting and has exactly one live out-byte (docs/internals.md §6.1)."""
        out = bytearray()
        single = self._single_byte
        while not self.accepting[state] and single[state] >= 0 and len(out) <= self.dead:
            byte = int(single[state])
            out.append(byte)
            state = int(self.transitions[state, byte])
        return bytes(out)


# Compiling is pure and ByteDFA immutable, so results are shared process-wide: the compiler
# checks a literal pattern and the runtime builds its token index from the same DFA. Long
# bounded repeats still cost some time (x{19999}: ~0.7 s), so paying once matters.
@functools.lru_cache(maxsize=256)
def compile_dfa(
    pattern: str,
    prefix: bytes = b"",
    *,
    max_states: int = DFA_MAX_STATES,
    max_nfa_states: int = NFA_MAX_STATES,
) -> ByteDFA:
    """Compile a regex (Python `regex` syntax, full-match, ASCII classes: syntax.py) to a byte
    DFA. With `prefix`, the language is `prefix` followed by a match of `pattern`, where the
    pattern's own `^`, `(?i)`... still apply to the pattern alone (token healing puts the text
    it took back from the context first).

    Raises:
        PatternError: invalid syntax, a construct with no DFA (backreference, lookaround, word
            boundary, ...), an empty language, or more than `max_states` DFA / `max_nfa_states`
            NFA states.
    """
    if prefix:
        base = compile_dfa(pattern, max_states=max_states, max_nfa_states=max_nfa_states)
        return _prefixed(base, prefix)
    nfa = _Nfa(max_nfa_states)
    start, final = nfa.build(parse(pattern))
    by_class, class_of, accepting = _determinize(nfa, start, final, max_states)
    by_class, accepting, dfa_start = _prune_and_minimise(by_class, accepting, 0)
    if by_class.shape[0] == 1:
        raise PatternError(f"regex {pattern!r} matches nothing")
    return _finish(pattern, b"", np.ascontiguousarray(by_class[:, class_of]), accepting,
                   dfa_start)


def _finish(pattern: str, prefix: bytes, table: npt.NDArray[np.int32],
            accepting: npt.NDArray[np.bool_], start: int) -> ByteDFA:
    dead = table.shape[0] - 1
    dist = distances_to_accept(table, accepting, np.ones(256, dtype=np.bool_))
    live = table != dead
    counts = live.sum(axis=1)
    single = np.where(counts == 1, live.argmax(axis=1), -1).astype(np.int16)
    for array in (table, accepting, dist, single):
        array.flags.writeable = False
    return ByteDFA(pattern, prefix, table, accepting, start, dist, single)


def _prefixed(base: ByteDFA, prefix: bytes) -> ByteDFA:
    """`base` with a chain of states for `prefix` before its start: state i (< len(prefix))
    reads prefix[i] only, and the last one leads into base's start."""
    k = len(prefix)
    old = base.transitions.astype(np.int32) + k  # base's states (and its dead) shift by k
    chain = np.full((k, 256), old.shape[0] - 1 + k, dtype=np.int32)
    for i, byte in enumerate(prefix):
        chain[i, byte] = i + 1 if i + 1 < k else base.start + k
    table = np.ascontiguousarray(np.vstack([chain, old]))
    accepting = np.concatenate([np.zeros(k, dtype=np.bool_), base.accepting])
    return _finish(base.pattern, prefix, table, accepting, 0)


def distances_to_accept(
    table: npt.NDArray[np.int32], accepting: npt.NDArray[np.bool_], usable: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int32]:
    """Fewest transitions from each state to acceptance using only the columns (bytes, or byte
    classes) marked `usable`. Unreachable states (and dead) get UNREACHABLE."""
    n = table.shape[0]
    sub = table[:, usable]
    src = np.repeat(np.arange(n, dtype=np.int64), sub.shape[1])
    return edge_distances(n, src, sub.reshape(-1).astype(np.int64), accepting)


UNREACHABLE = np.iinfo(np.int32).max // 2


def edge_distances(
    n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], accepting: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int32]:
    """Fewest edges from each of `n` states to an accepting one, for the graph with edges
    src[i] -> dst[i] (BFS on the reversed graph). Unreachable: UNREACHABLE."""
    dist = np.full(n, UNREACHABLE, dtype=np.int32)
    pairs = np.unique(dst * n + src)
    order_dst, order_src = pairs // n, pairs % n
    starts = np.searchsorted(order_dst, np.arange(n + 1))
    queue = deque(int(s) for s in np.flatnonzero(accepting))
    dist[list(queue)] = 0
    while queue:
        state = queue.popleft()
        for pred in order_src[starts[state] : starts[state + 1]]:
            if dist[pred] == UNREACHABLE:
                dist[pred] = dist[state] + 1
                queue.append(int(pred))
    return dist


# ---------------------------------------------------------------------------------------------
# Thompson NFA over byte ranges


class _Nfa:
    """Mutable NFA under construction (private to compile_dfa). States are ints; `edges[s]` holds
    (lo, hi, target) byte ranges, `eps[s]` plain epsilon moves, `begin[s]` epsilon moves valid
    only before any byte was read (`^`, `\\A`), `end[s]`/`dollar[s]` epsilon moves into ENDED
    mode (`\\Z`) or into ENDED-or-NL_PENDING mode (`$`)."""

    def __init__(self, max_states: int) -> None:
        self.max_states = max_states
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.begin: list[list[int]] = []
        self.end: list[list[int]] = []
        self.dollar: list[list[int]] = []

    def new(self) -> int:
        if len(self.edges) >= self.max_states:
            raise PatternError(
                f"regex is too large (more than {self.max_states} NFA states); "
                "reduce bounded repeat counts such as {1,5000}"
            )
        for table in (self.edges, self.eps, self.begin, self.end, self.dollar):
            table.append([])
        return len(self.edges) - 1

    def build(self, node: Node) -> tuple[int, int]:
        """A fragment (entry, exit) for an AST node."""
        match node:
            case Chars(ranges=ranges):
                return self._charset(ranges)
            case Seq(items=items):
                start = cur = self.new()
                for item in items:
                    entry, exit_ = self.build(item)
                    self.eps[cur].append(entry)
                    cur = exit_
                return start, cur
            case Alt(options=options):
                start, end = self.new(), self.new()
                for option in options:
                    entry, exit_ = self.build(option)
                    self.eps[start].append(entry)
                    self.eps[exit_].append(end)
                return start, end
            case Repeat():
                return self._repeat(node)
            case Anchor(kind=kind):
                start, end = self.new(), self.new()
                moves = {"start": self.begin, "end": self.end, "dollar": self.dollar}[kind]
                moves[start].append(end)
                return start, end

    def _charset(self, ranges: Ranges) -> tuple[int, int]:
        start, end = self.new(), self.new()
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                cur = start
                for i, (b_lo, b_hi) in enumerate(seq):
                    nxt = end if i == len(seq) - 1 else self.new()
                    self.edges[cur].append((b_lo, b_hi, nxt))
                    cur = nxt
        return start, end

    def _repeat(self, node: Repeat) -> tuple[int, int]:
        start = cur = self.new()
        for _ in range(node.low):
            entry, exit_ = self.build(node.item)
            self.eps[cur].append(entry)
            cur = exit_
        if node.high is None:
            entry, exit_ = self.build(node.item)
            loop = self.new()
            self.eps[cur].append(loop)
            self.eps[loop].append(entry)
            self.eps[exit_].append(loop)
            return start, loop
        end = self.new()
        for _ in range(node.high - node.low):
            # Each optional copy may be skipped straight to the end: a(a(a)?)? shape.
            self.eps[cur].append(end)
            entry, exit_ = self.build(node.item)
            self.eps[cur].append(entry)
            cur = exit_
        self.eps[cur].append(end)
        return start, end


# ---------------------------------------------------------------------------------------------
# Subset construction over byte classes


def _determinize(
    nfa: _Nfa, start: int, final: int, max_states: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """Powerset construction over byte classes (maximal byte ranges no NFA edge tells apart).
    Returns the [S+1, n_classes] table (last row dead, start 0), the class of each byte, and
    the accepting flags."""
    bounds = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            bounds.update((lo, hi + 1))
    cuts = sorted(bounds)
    class_of = np.zeros(256, dtype=np.intp)
    for index, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        class_of[a:b] = index
    n_classes = len(cuts) - 1
    class_edges = [
        [(int(class_of[lo]), int(class_of[hi]), t) for lo, hi, t in edges] for edges in nfa.edges
    ]
    closures = _Closures(nfa)
    newline_class = int(class_of[NEWLINE])

    first = closures.of([start * 3 + _NORMAL], at_start=True)
    ids: dict[frozenset[int], int] = {first: 0}
    order = [first]
    rows: list[list[int]] = []
    accepting: list[bool] = []
    finals = {final * 3 + _ENDED, final * 3 + _NORMAL}
    for current in order:  # `order` grows while we iterate: a BFS over DFA states
        targets: list[set[int]] = [set() for _ in range(n_classes)]
        for code in current:
            state, mode = divmod(code, 3)
            if mode == _ENDED:
                continue
            for c_lo, c_hi, target in class_edges[state]:
                if mode == _NL_PENDING:
                    if c_lo <= newline_class <= c_hi:
                        targets[newline_class].add(target * 3 + _ENDED)
                    continue
                for cls in range(c_lo, c_hi + 1):
                    targets[cls].add(target * 3 + _NORMAL)
        row = []
        for seed in targets:
            if not seed:
                row.append(-1)
                continue
            closed = closures.of(seed, at_start=False)
            if closed not in ids:
                if len(order) >= max_states:
                    raise PatternError(
                        f"regex needs more than {max_states} DFA states; simplify it "
                        "(fewer alternatives, smaller bounded repeats)"
                    )
                ids[closed] = len(order)
                order.append(closed)
            row.append(ids[closed])
        rows.append(row)
        accepting.append(not finals.isdisjoint(current))
    n = len(order)
    by_class = np.array(rows, dtype=np.int32).reshape(n, n_classes)
    by_class[by_class < 0] = n
    table = np.vstack([by_class, np.full((1, n_classes), n, dtype=np.int32)])
    return table, class_of, np.array([*accepting, False], dtype=np.bool_)


class _Closures:
    """Epsilon closures of encoded NFA states (state * 3 + mode), memoised per state."""

    def __init__(self, nfa: _Nfa) -> None:
        self._nfa = nfa
        self._memo: dict[tuple[int, bool], frozenset[int]] = {}

    def of(self, seed: Iterable[int], at_start: bool) -> frozenset[int]:
        out: set[int] = set()
        for code in seed:
            out |= self._one(code, at_start)
        return frozenset(out)

    def _one(self, code: int, at_start: bool) -> frozenset[int]:
        key = (code, at_start)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        nfa = self._nfa
        seen = {code}
        stack = [code]
        while stack:
            state, mode = divmod(stack.pop(), 3)
            moves = [t * 3 + mode for t in nfa.eps[state]]
            if at_start:
                moves += [t * 3 + mode for t in nfa.begin[state]]
            moves += [t * 3 + _ENDED for t in nfa.end[state]]
            for target in nfa.dollar[state]:
                moves.append(target * 3 + _ENDED)
                if mode == _NORMAL:
                    moves.append(target * 3 + _NL_PENDING)
            for move in moves:
                if move not in seen:
                    seen.add(move)
                    stack.append(move)
        result = frozenset(seen)
        self._memo[key] = result
        return result


def _prune_and_minimise(
    table: npt.NDArray[np.int32], accepting: npt.NDArray[np.bool_], start: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_], int]:
    """Map states that cannot reach acceptance to dead, merge equivalent states (Moore's
    partition refinement, vectorised), renumber in BFS order from the start (deterministic),
    dead last."""
    n, width = table.shape
    dead = n - 1
    dist = distances_to_accept(table, accepting, np.ones(width, dtype=np.bool_))
    live = dist < UNREACHABLE
    table = np.where(live[table], table, dead).astype(np.int32)
    table[~live] = dead
    # Moore refinement, refining by successor classes until stable. It starts from what
    # equivalent states share: the shortest distance to acceptance (0: accepting) and the
    # longest word left (_heights; dead states apart). A chain such as x{3000} or
    # [a-z]{1,3000} is then told apart at once instead of one state per round (3,000 rounds,
    # quadratic: x{19999} took over a minute). Rows are compared as raw bytes (a void view),
    # much faster than np.unique(axis=0).
    heights = _heights(table, live)
    start_key = np.where(live, dist.astype(np.int64) * (n + 2) + heights + 1, -1)
    _, labels = np.unique(start_key, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    count = int(labels.max()) + 1
    while True:
        signature = np.ascontiguousarray(np.hstack([labels[:, None], labels[table]]))
        rows = signature.view(np.dtype((np.void, signature.itemsize * (width + 1)))).ravel()
        _, labels = np.unique(rows, return_inverse=True)
        labels = labels.reshape(-1).astype(np.int64)
        new_count = int(labels.max()) + 1
        if new_count == count:
            break
        count = new_count
    return _renumber(table, accepting, labels, start, int(labels[dead]))


def _heights(table: npt.NDArray[np.int32], live: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """Per state, the length of the longest word that stays among live states from it (0: no
    live successor), or -1 where a cycle can be reached (no longest word). Kahn's order over
    the distinct live edges, each edge once."""
    n, width = table.shape
    src = np.repeat(np.arange(n, dtype=np.int64), width)
    dst = table.ravel().astype(np.int64)
    keep = live[src] & live[dst]
    pairs = np.unique(src[keep] * n + dst[keep])
    src, dst = pairs // n, pairs % n
    left = np.bincount(src, minlength=n)
    order = np.argsort(dst, kind="stable")
    preds, bounds = src[order], np.searchsorted(dst[order], np.arange(n + 1))
    heights = np.full(n, -1, dtype=np.int64)
    ready = [int(s) for s in np.flatnonzero(live & (left == 0))]
    heights[ready] = 0
    while ready:
        state = ready.pop()
        for pred in preds[bounds[state]:bounds[state + 1]].tolist():
            heights[pred] = max(heights[pred], heights[state] + 1)
            left[pred] -= 1
            if left[pred] == 0:
                ready.append(pred)
    heights[left > 0] = -1  # reaches a cycle: its longest word is unbounded
    return heights


def _renumber(
    table: npt.NDArray[np.int32],
    accepting: npt.NDArray[np.bool_],
    labels: npt.NDArray[np.int64],
    start: int,
    dead_label: int,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_], int]:
    width = table.shape[1]
    if labels[start] == dead_label:
        return np.zeros((1, width), dtype=np.int32), np.zeros(1, dtype=np.bool_), 0
    representative: dict[int, int] = {}
    for state in range(table.shape[0]):
        representative.setdefault(int(labels[state]), state)
    new_id = {int(labels[start]): 0}
    queue = deque([int(labels[start])])
    while queue:
        label = queue.popleft()
        for target in np.unique(table[representative[label]]):
            target_label = int(labels[target])
            if target_label != dead_label and target_label not in new_id:
                new_id[target_label] = len(new_id)
                queue.append(target_label)
    size = len(new_id)
    out = np.full((size + 1, width), size, dtype=np.int32)
    out_accepting = np.zeros(size + 1, dtype=np.bool_)
    mapping = np.full(int(labels.max()) + 1, size, dtype=np.int32)
    for label, index in new_id.items():
        mapping[label] = index
    for label, index in new_id.items():
        rep = representative[label]
        out[index] = mapping[labels[table[rep]]]
        out_accepting[index] = accepting[rep]
    return out, out_accepting, 0
