"""Work shared across runs: a token trie whose nodes hold KV snapshots and next-token logits,
with a byte budget and least-recently-used eviction (leaves first). Many runs of one template
pay for their shared prefix once, and an identical run costs no forward at all.

Design after genlm's TokenTrie / LLaMPPL's logprob cache and SGLang's radix cache, reduced to
what a session needs: `lookup` finds the deepest snapshot on a run's token ids and the logits
after exactly those ids; `insert` records them after a forward. As in SGLang's radix cache, a
run shares with an earlier one every token they have in common, not only those before a
snapshot: where the earlier run's snapshot lies past the point the two part, it is forked and
cropped to that point (a chat request's instruction and a question in one message are one
stretch, with no snapshot between them)."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from qrun.backends.kv_cache import KVCache
from qrun.options import DEFAULT_CACHE_MB

SEARCH_NODES = 4096
"""How many nodes a lookup looks at below the point a run parts from the cached tokens, for a
snapshot to crop (prefix_cache.py PrefixCache._snapshot_below)."""


@dataclass(eq=False, slots=True)
class _Node:
    """One token position: `kv` holds the KV of every position up to and including it,
    `logits` the next-token logits after it ([V] float32, a numpy array)."""

    token: int
    depth: int
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    kv: KVCache | None = None
    logits: npt.NDArray[np.float32] | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    """What the cache holds for a run's token ids: KV of their longest cached prefix past
    `after` (`kv` forked for the caller, covering `kv_length` positions) and the logits after
    all ids."""

    kv: KVCache | None
    kv_length: int
    logits: npt.NDArray[np.float32] | None


class PrefixCache:
    """A thread-safe token trie of KV snapshots and logits under a byte budget.

    Bytes are measured from the tensors held (each KV storage counted once, however many
    snapshots share it). Eviction drops the least recently used entry first; a lookup touches
    the entries on its path from the deepest up, so ancestors (shared prefixes) stay more
    recent than their leaves and are evicted after them.
    """

    def __init__(self, budget_bytes: int = DEFAULT_CACHE_MB << 20) -> None:
        if budget_bytes < 0:
            raise ValueError("cache budget must be ≥ 0 bytes")
        self.budget_bytes = budget_bytes
        self._root = _Node(token=-1, depth=0, parent=None)
        self._lock = threading.Lock()
        self._lru: OrderedDict[tuple[_Node, str], None] = OrderedDict()
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [nbytes, refcount]
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the snapshots and logits (each storage once)."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._lru)

    def entries(self) -> list[tuple[str, KVCache | npt.NDArray[np.float32]]]:
        """Every entry held, least recently used first: ("kv", snapshot) or ("logits", [V])."""
        with self._lock:
            held: list[tuple[str, KVCache | npt.NDArray[np.float32]]] = []
            for node, kind in self._lru:
                value = node.kv if kind == "kv" else node.logits
                assert value is not None
                held.append((kind, value))
            return held

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            for node, kind in list(self._lru):
                self._drop(node, kind)
            self._root.children.clear()

    def lookup(self, token_ids: Sequence[int], after: int) -> Hit:
        """KV of the longest prefix of `token_ids` longer than `after` positions that the
        cache holds (the deepest snapshot on their path, or a snapshot past the point where
        they part from the cached tokens, forked and cropped there), and the logits after all
        of `token_ids` when cached. Without those logits a crop stops one position short: the
        caller feeds the last token for them."""
        with self._lock:
            node, path = self._root, []
            for token in token_ids:
                child = node.children.get(token)
                if child is None:
                    break
                node = child
                path.append(node)
            logits = node.logits if path and node.depth == len(token_ids) else None
            best = next((n for n in reversed(path) if n.kv is not None and n.depth > after), None)
            for n in reversed(path):
                for kind in ("kv", "logits"):
                    if (n, kind) in self._lru:
                        self._lru.move_to_end((n, kind))
            depth = node.depth if logits is not None or node.depth < len(token_ids) \
                else node.depth - 1
            if path and depth > max(after, best.depth if best is not None else 0):
                below = self._snapshot_below(node)
                if below is not None and below.kv is not None:
                    self._lru.move_to_end((below, "kv"))
                    cropped = below.kv.fork()
                    cropped.crop(depth)  # its first positions are these tokens' own
                    return Hit(cropped, depth, logits)
            if logits is None and best is None:
                return Hit(None, 0, None)
            kv = best.kv.fork() if best is not None and best.kv is not None else None
            return Hit(kv, best.depth if best is not None else 0, logits)

    def _snapshot_below(self, node: _Node) -> _Node | None:
        """The nearest node under `node` holding a KV snapshot, breadth first, looking at
        SEARCH_NODES nodes at most (a snapshot lies at the end of each forward, so one is
        rarely far)."""
        queue = deque(node.children.values())
        for _ in range(SEARCH_NODES):
            if not queue:
                return None
            child = queue.popleft()
            if child.kv is not None:
                return child
            queue.extend(child.children.values())
        return None

    def insert(
        self, token_ids: Sequence[int], kv: KVCache | None, logits: npt.NDArray[np.float32] | None
    ) -> None:
        """Record the KV of `token_ids` (a fork is kept) and/or the logits after them."""
        if not token_ids or self.budget_bytes == 0:
            return
        with self._lock:
            node = self._root
            for token in token_ids:
                child = node.children.get(token)
                if child is None:
                    child = _Node(token=token, depth=node.depth + 1, parent=node)
                    node.children[token] = child
                node = child
            if kv is not None and node.kv is None:
                node.kv = self.keep(kv)
                self._add(node, "kv")
            if logits is not None and node.logits is None:
                node.logits = np.array(logits, dtype=np.float32, copy=True)
                self._add(node, "logits")
            self._evict()

    def keep(self, kv: KVCache) -> KVCache:
        """What an entry holds of `kv`, a run's cache: a fork of it. A backend whose snapshots
        are better kept apart from its runs' caches overrides this (backends/llamacpp.py)."""
        return kv.fork()

    def _add(self, node: _Node, kind: str) -> None:
        self._lru[(node, kind)] = None
        for ptr, size in self._entry_storages(node, kind):
            held = self._storages.get(ptr)
            if held is None:
                self._storages[ptr] = [size, 1]
                self._nbytes += size
            else:
                held[1] += 1

    def _drop(self, node: _Node, kind: str) -> None:
        for ptr, _ in self._entry_storages(node, kind):
            held = self._storages[ptr]
            held[1] -= 1
            if held[1] == 0:
                self._nbytes -= held[0]
                del self._storages[ptr]
        del self._lru[(node, kind)]
        setattr(node, kind, None)
        # Prune nodes left with nothing to hold and no children.
        while (node.parent is not None and not node.children and node.kv is None
               and node.logits is None):
            del node.parent.children[node.token]
            node = node.parent

    def _evict(self) -> None:
        while self._nbytes > self.budget_bytes and self._lru:
            node, kind = next(iter(self._lru))
            self._drop(node, kind)

    @staticmethod
    def _entry_storages(node: _Node, kind: str) -> list[tuple[int, int]]:
        if kind == "logits":
            assert node.logits is not None
            return [(node.logits.ctypes.data, node.logits.nbytes)]
        assert node.kv is not None
        return node.kv.storages()
