"""The llama.cpp adapter: a GGUF model run in process by llama.cpp (through llama-cpp-python's
ctypes layer, wrapped in backends/llamacpp_api.py), behind the same Backend protocol as
transformers. The GGUF is used as shipped: no conversion, its own tokenizer.

How the protocol maps onto llama.cpp: one context with one unified KV cache serves every run.
A KVCache is a sequence id of that cache; `fork` gives a new id the same cells
(`llama_memory_seq_cp`, a metadata copy), `crop` removes positions (`llama_memory_seq_rm`),
and an id goes back to the free list when its cache object dies. A forward is one
`llama_decode` of the new tokens at explicit positions with output flags on the last
`logits_for`; the logits are copied out and handed to qrun's own masks and sampler, so every
constraint means exactly what it means on transformers. Batched runs put each run's tokens
under its own sequence id in one batch; a select's options are a token tree in one batch,
one sequence id per leaf (a node belongs to the sequences of the leaves below it, so it
attends to the context and its ancestors only). The prefix cache keeps its snapshots in host
memory, off the KV cells (HostSnapshot): only running sequences hold cells."""

from __future__ import annotations

import ctypes
import gc
import json
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from qrun.backends.base import (
    BackendDefaults,
    BatchForward,
    Capabilities,
    StepModel,
    TreeScorer,
    control_tokens_of,
)
from qrun.backends.chat_template import (
    ToolCallFormat,
    ToolTurn,
    role_markers,
    tool_call_format,
    tools_turn,
)
from qrun.backends.llama_threads import llama_threads
from qrun.backends.llamacpp_api import DECODE_NO_ROOM, Batch, Context, Model, last_log
from qrun.backends.prefix_cache import PrefixCache
from qrun.constraint import Vocabulary
from qrun.errors import BackendError

# llama.cpp's limit on sequence ids in one context (LLAMA_MAX_SEQ in llama-cparams.h).
MAX_SEQUENCES = 256
# Positions per llama_decode call; longer inputs are fed in several.
BATCH_TOKENS = 2048
# Leaves of a select's token tree scored in one decode: one sequence id each.
TREE_LEAVES = 32
# Sequence ids a select's token tree leaves free for the other runs (forward_tree).
RESERVED_SEQUENCES = 16


class LlamaCppError(BackendError):
    """llama.cpp refused a batch (context full, invalid input)."""


class LlamaCache:
    """One sequence of the shared KV cache: its id and how many positions it holds."""

    def __init__(self, backend: LlamaCppBackend, seq: int, length: int) -> None:
        self.backend = backend
        self.seq = seq
        self.positions = length
        # The id is freed when this object dies (llama.cpp's cells in the next allocation).
        weakref.finalize(self, backend.dead.append, seq)

    def length(self) -> int:
        return self.positions

    def crop(self, length: int) -> None:
        if length > self.positions:
            raise ValueError(f"cannot crop a {self.positions}-position cache to {length}")
        if length < self.positions:
            with self.backend.lock:
                self.backend.context().seq_rm(self.seq, length)
            self.positions = length

    def fork(self) -> LlamaCache:
        return self.backend.fork(self, self.positions)

    def storages(self) -> list[tuple[int, int]]:
        # Cells shared with forks are counted once per sequence: the budget errs on the safe
        # side. The key stands for the sequence (no pointer is ever negative).
        return [(-1 - self.seq, self.positions * self.backend.kv_bytes_per_position)]

    def release(self, wait: bool = False) -> None:
        pass  # nothing is held between forwards

    def take_counts(self) -> None:
        return None  # a forward computes exactly the tokens it is given


class LlamaTree:
    """What forward_tree leaves for keep_path: the cache it grew from and, per node, a leaf
    sequence below it holding the context then that leaf's chain of nodes (or none, when the
    tree took several decodes: keep_path then feeds the path again)."""

    def __init__(self, base: LlamaCache, tokens: list[int], leaf_of: list[int],
                 leaves: dict[int, LlamaCache]) -> None:
        self.base = base
        self.tokens = tokens
        self.leaf_of = leaf_of
        self.leaves = leaves

    def length(self) -> int:
        return self.base.positions + len(self.tokens)

    def crop(self, length: int) -> None:
        raise ValueError("a select tree is read through keep_path only")

    def fork(self) -> LlamaTree:
        raise ValueError("a select tree is read through keep_path only")

    def storages(self) -> list[tuple[int, int]]:
        return []

    def release(self, wait: bool = False) -> None:
        pass

    def take_counts(self) -> None:
        return None


class HostSnapshot:
    """A prefix-cache entry in host memory: a copy of a sequence's cells (llama.cpp's sequence
    state, SmolLM2's 23 KB a position). Why not the cells themselves: llama.cpp's attention
    spans every cell up to the highest in use, so snapshots left in the cells made every later
    forward dearer (issue #37: a 16-particle run 48-52 ms on a fresh cache, 128-174 ms after
    70-210 fresh prompts had left theirs). A fork writes the copy into a new sequence."""

    def __init__(self, backend: LlamaCppBackend, state: Any, positions: int) -> None:
        self.backend = backend
        self.state = state
        self.positions = positions

    def length(self) -> int:
        return self.positions

    def crop(self, length: int) -> None:
        raise ValueError("a prefix-cache snapshot is read through fork")

    def fork(self) -> LlamaCache:
        return self.backend.restore(self)

    def storages(self) -> list[tuple[int, int]]:
        return [(ctypes.addressof(self.state), len(self.state))]

    def release(self, wait: bool = False) -> None:
        pass

    def take_counts(self) -> None:
        return None


class HostPrefixCache(PrefixCache):
    """The prefix cache of llama.cpp: what it keeps of a run's cache is a HostSnapshot."""

    def __init__(self, budget_bytes: int, backend: LlamaCppBackend) -> None:
        super().__init__(budget_bytes)
        self._backend = weakref.ref(backend)

    def keep(self, kv: Any) -> Any:
        backend = self._backend()
        if backend is None or not isinstance(kv, LlamaCache):
            return kv.fork()
        return backend.snapshot(kv)


class LlamaCppBackend(BackendDefaults):
    """A GGUF model on llama.cpp: token-level forwards over one unified KV cache, batched
    forwards (one sequence per run) and token trees for select. Thread-safe: one lock
    around every call on the context."""

    kind = "llamacpp"

    # What each guessed token adds to a one-token forward (bench/forward_cost.py, 1 + 4 tokens
    # on a 64-token context, 2 threads): 0.58 for SmolLM2's Q4_1 row by row, 0.39 with the
    # tiled Q4_1 kernel qrun's build adds (scripts/patches/llamacpp-q4_1-sgemm.patch), 0.46 on
    # the q8_0 copy; guesses pay only while the model takes more than that share of them.
    capabilities = Capabilities(batches_itself=False, heals_in_context=True, lookahead=True,
                                draft_cost=0.4)

    def __init__(self, model: Model, context: Context | None, name: str, cache_mb: int,
                 load_s: float = 0.0) -> None:
        self.model = model
        self._context = context
        self.name = name
        self.device = "cpu"
        self.dtype = model.description.split()[-1] if model.description else "gguf"
        self.load_s = load_s
        self.lock = threading.Lock()
        self.kv_bytes_per_position = model.kv_bytes_per_position
        self.free = list(range(context.n_seq_max - 1, -1, -1)) if context else []
        self.dead: list[int] = []  # ids of caches that died, their cells not yet removed
        self.prefix_cache: PrefixCache | None = (
            HostPrefixCache(cache_mb << 20, self) if cache_mb > 0 and context else None)
        limits = [n for n in (model.n_ctx_train, context.n_ctx if context else 0) if n > 0]
        self._max_context = min(limits) if limits else None
        self._markers: dict[str, tuple[str, str] | None] = {}
        self._tool_format: tuple[ToolCallFormat | None] | None = None  # (found,) once read
        self._vocabulary: Vocabulary | None = None
        self._control_tokens: dict[str, int] | None = None

    # --- the tokenizer half ----------------------------------------------------------------

    @property
    def max_context(self) -> int | None:
        return self._max_context

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    @property
    def eos_token_ids(self) -> frozenset[int]:
        # The GGUF's EOS only: llama.cpp's end-of-generation set also has <|endoftext|> and
        # FIM tokens, which the transformers backend does not end on.
        return frozenset([self.model.eos]) if self.model.eos >= 0 else frozenset()

    @property
    def start_token_id(self) -> int:
        for token in (self.model.bos, self.model.eos, 0):
            if token >= 0:
                return token
        return 0

    @property
    def vocabulary(self) -> Vocabulary:
        if self._vocabulary is None:
            # Control tokens have no text (empty pieces): never allowed inside holes.
            pieces = [self.model.piece(i) for i in range(self.model.n_vocab)]
            self._vocabulary = Vocabulary.from_token_bytes(pieces, sorted(self.eos_token_ids))
        return self._vocabulary

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        return self.model.tokenize(text, special)

    def decode(self, token_ids: Sequence[int]) -> str:
        data = b"".join(self.model.piece(int(i)) for i in token_ids)
        return data.decode("utf-8", "replace")

    @property
    def control_tokens(self) -> Mapping[str, int]:
        if self._control_tokens is None:
            # Control tokens have no piece (Vocabulary: None); their text is their name.
            candidates = {i: self.model.text(i) for i, data
                          in enumerate(self.vocabulary.token_bytes) if data is None}
            self._control_tokens = control_tokens_of(self.encode, candidates)
        return self._control_tokens

    def chat_markers(self, role: str) -> tuple[str, str] | None:
        if role not in self._markers:
            self._markers[role] = (role_markers(self._render, role)
                                   if self._chat_template() else None)
        return self._markers[role]

    def tool_call_format(self) -> ToolCallFormat | None:
        if self._tool_format is None:
            found = tool_call_format(self._render) if self._chat_template() else None
            self._tool_format = (found,)
        return self._tool_format[0]

    def tools_turn(self, tools: list[dict[str, Any]]) -> ToolTurn | None:
        if not self._chat_template():
            return None
        return tools_turn(self._render, tools, self.control_tokens)

    def _chat_template(self) -> str:
        return str(self.model.meta("tokenizer.chat_template") or "")

    def _render(self, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None) -> str:
        return render_chat(
            self._chat_template(), messages, tools,
            bos_token=self.model.text(self.model.bos) if self.model.bos >= 0 else "",
            eos_token=self.model.text(self.model.eos) if self.model.eos >= 0 else "")

    # --- engines ---------------------------------------------------------------------------

    def step_model(self) -> StepModel | None:
        return self if self._context is not None else None

    def batch_forward(self) -> BatchForward | None:
        return self if self._context is not None else None

    def tree_scorer(self) -> TreeScorer | None:
        return self if self._context is not None else None

    def clear_cache(self) -> None:
        """Forget the prefix cache; when no run holds a sequence then, empty the KV cache too,
        so that the next run's cells are laid out as in a fresh context (where llama.cpp puts
        a sequence's cells can change its logits in the last bits, and a greedy near-tie with
        them). Sequences of finished runs that only a reference cycle keeps (a fork branch's
        run and its calls) are collected first."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        gc.collect()
        with self.lock:
            if self._context is None:
                return
            context = self.context()
            self._reap(context)
            if len(self.free) == context.n_seq_max:
                context.clear()
                self.free = list(range(context.n_seq_max - 1, -1, -1))

    def close(self) -> None:
        """Free the context and the model (every cache of this backend becomes unusable)."""
        with self.lock:
            if self._context is not None:
                self._context.close()
                self._context = None
            self.model.close()

    def context(self) -> Context:
        """The llama.cpp context (callers hold `lock`)."""
        if self._context is None:
            raise LlamaCppError(f"model '{self.name}' has no llama.cpp context (closed, or "
                                "loaded without weights)")
        return self._context

    # --- sequences -------------------------------------------------------------------------

    def free_sequences(self) -> int:
        return len(self.free) + len(self.dead)

    def _reap(self, context: Context) -> None:
        """Remove the cells of sequences whose caches died; their ids become free (caller
        holds the lock)."""
        while self.dead:
            seq = self.dead.pop()
            context.seq_rm(seq, -1)
            self.free.append(seq)

    def new_cache(self) -> LlamaCache:
        return self._allocate(None, 0)

    def fork(self, cache: LlamaCache, length: int) -> LlamaCache:
        """A new sequence sharing `cache`'s cells for its first `length` positions."""
        return self._allocate(cache, length)

    def _allocate(self, source: LlamaCache | None, length: int) -> LlamaCache:
        with self.lock:
            context = self.context()
            self._reap(context)
            if not self.free:
                raise LlamaCppError(f"all {MAX_SEQUENCES} llama.cpp sequences are in use "
                                    "(too many runs or select options at once)")
            seq = self.free.pop()
            if source is not None and length > 0:
                context.seq_cp(source.seq, seq, length)
            return LlamaCache(self, seq, length)

    def snapshot(self, cache: LlamaCache) -> HostSnapshot:
        """A copy of `cache`'s cells in host memory, for the prefix cache."""
        with self.lock:
            return HostSnapshot(self, self.context().seq_state(cache.seq), cache.positions)

    def restore(self, snapshot: HostSnapshot) -> LlamaCache:
        """A new sequence holding `snapshot`'s positions, written into free cells."""
        cache = self.new_cache()
        with self.lock:
            if not self.context().set_seq_state(cache.seq, snapshot.state):
                raise LlamaCppError(f"the KV cache of llama.cpp ({self.context().n_ctx} "
                                    "positions for all runs) is full")
        cache.positions = snapshot.positions
        return cache

    def _decode(self, batch: Batch) -> np.ndarray[Any, np.dtype[np.float32]]:
        """Decode `batch`; the copied output rows [outputs, V]."""
        with self.lock:
            context = self.context()
            self._reap(context)
            code = context.decode(batch)
            if code == 0:
                return context.logits(batch.outputs)
        if code == DECODE_NO_ROOM:
            raise LlamaCppError(f"the KV cache of llama.cpp ({context.n_ctx} positions for all "
                                "runs) is full")
        raise LlamaCppError(f"llama.cpp refused a batch of {batch.n} tokens (llama_decode "
                            f"{code}): {last_log() or 'invalid'}")

    # --- forwards --------------------------------------------------------------------------

    def forward(self, token_ids: Sequence[int], cache: Any, logits_for: int = 1
                ) -> npt.NDArray[np.float32]:
        assert isinstance(cache, LlamaCache)
        ids = [int(i) for i in token_ids]
        if not ids or not 1 <= logits_for <= len(ids):
            raise ValueError(f"cannot keep {logits_for} logits of {len(ids)} tokens")
        rows = []
        first_output = len(ids) - logits_for
        for start in range(0, len(ids), BATCH_TOKENS):
            chunk = ids[start:start + BATCH_TOKENS]
            batch = Batch(len(chunk))
            batch.add(chunk, cache.positions, cache.seq,
                      max(0, start + len(chunk) - max(start, first_output)))
            rows.append(self._decode(batch))
            cache.positions += len(chunk)
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def forward_batch(self, items: Sequence[tuple[Sequence[int], Any]],
                      logits_for: int = 1) -> list[npt.NDArray[np.float32]]:
        """Every item's new tokens under its own sequence id in one llama_decode (several
        when they do not fit one batch)."""
        if sum(len(ids) for ids, _ in items) > BATCH_TOKENS or len(items) < 2:
            return [self.forward(ids, cache, min(logits_for, len(ids))) for ids, cache in items]
        batch = Batch(sum(len(ids) for ids, _ in items))
        outputs = []
        for ids, cache in items:
            assert isinstance(cache, LlamaCache)
            outputs.append(min(logits_for, len(ids)))
            batch.add([int(i) for i in ids], cache.positions, cache.seq, outputs[-1])
        logits = self._decode(batch)
        for ids, cache in items:
            cache.positions += len(ids)
        bounds = np.cumsum([0, *outputs])
        return [logits[bounds[i]:bounds[i + 1]] for i in range(len(items))]

    def forward_tree(self, token_ids: Sequence[int], parents: Sequence[int],
                     cache: Any) -> tuple[npt.NDArray[np.float32], LlamaTree]:
        assert isinstance(cache, LlamaCache)
        tokens, n = [int(t) for t in token_ids], len(token_ids)
        depth = [0] * n
        for i, parent in enumerate(parents):
            assert -1 <= parent < i, "a node's parent comes before it"
            depth[i] = depth[parent] + 1 if parent >= 0 else 0
        below: list[list[int]] = [[] for _ in range(n)]  # leaves under each node
        for i in range(n - 1, -1, -1):
            if not below[i]:
                below[i].append(i)
            if parents[i] >= 0:
                below[parents[i]].extend(below[i])
        leaves = [i for i in range(n) if below[i] == [i]]
        leaf_of = [below[i][0] for i in range(n)]
        # A tree scored in one decode keeps a sequence per leaf until its path is kept; where
        # sequences run short (the particles of a block scoring trees side by side), smaller
        # decodes that keep none (keep_path then feeds the path again) instead of running out.
        room = max(1, (self.free_sequences() - RESERVED_SEQUENCES) // 4)
        groups = _groups(leaves, parents, min(TREE_LEAVES, room))
        out = np.empty((n, self.vocab_size), dtype=np.float32)
        kept: dict[int, LlamaCache] = {}
        for group in groups:
            seqs = {leaf: self.fork(cache, cache.positions) for leaf in group}
            nodes = sorted({a for leaf in group for a in _chain(leaf, parents)})
            batch = Batch(len(nodes), len(group))
            for node in nodes:
                batch.add_node(tokens[node], cache.positions + depth[node],
                               [seqs[leaf].seq for leaf in below[node] if leaf in seqs])
            out[nodes] = self._decode(batch)
            for leaf, seq in seqs.items():
                seq.positions = cache.positions + depth[leaf] + 1
            if len(groups) == 1:
                kept = seqs
        return out, LlamaTree(cache, tokens, leaf_of, kept)

    def keep_path(self, tree: Any, length: int, path: Sequence[int]) -> LlamaCache:
        assert isinstance(tree, LlamaTree)
        if not path:
            return self.fork(tree.base, length)
        leaf = tree.leaves.get(tree.leaf_of[path[-1]])
        if leaf is not None:
            return self.fork(leaf, length + len(path))
        kept = self.fork(tree.base, length)  # the tree took several decodes: feed it again
        self.forward([tree.tokens[node] for node in path], kept)
        return kept


def _chain(node: int, parents: Sequence[int]) -> list[int]:
    chain = []
    while node >= 0:
        chain.append(node)
        node = parents[node]
    return chain


def _groups(leaves: list[int], parents: Sequence[int], most: int) -> list[list[int]]:
    """Leaves in runs of at most `most` whose chains fit one batch together."""
    groups: list[list[int]] = []
    size = 0
    for leaf in leaves:
        chain = len(_chain(leaf, parents))
        if not groups or len(groups[-1]) == most or size + chain > BATCH_TOKENS:
            groups.append([])
            size = 0
        groups[-1].append(leaf)
        size += chain
    return groups


def load_llamacpp(name: str, gguf_path: str, cache_mb: int, weights: bool = True
                  ) -> LlamaCppBackend:
    """Load a GGUF file with llama.cpp: the model memory-mapped and one context for every
    run (none with `weights=False`: the tokenizer alone, from the vocabulary only).

    Raises:
        ModelLoadError: llama-cpp-python is missing, or llama.cpp cannot read the file.
    """
    started = time.perf_counter()
    model = Model(gguf_path, vocab_only=not weights)
    context = None
    if weights:
        trained = model.n_ctx_train if model.n_ctx_train > 0 else 4096
        # Room for one run of the model's full length and as much again for other runs and
        # cached prefixes (23 KB a position for SmolLM2: 360 MiB).
        cells = min(2 * trained, 32768)
        context = Context(model, cells, MAX_SEQUENCES, BATCH_TOKENS, llama_threads())
    return LlamaCppBackend(model, context, name, cache_mb, time.perf_counter() - started)



def render_chat(template: str, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, bos_token: str = "",
                eos_token: str = "") -> str:
    """A GGUF's chat template rendered as transformers renders chat templates (a sandboxed
    Jinja with trim_blocks and lstrip_blocks, its `tojson` and `raise_exception`): llama.cpp's
    own llama_chat_apply_template is not a Jinja engine."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=False, bos_token=bos_token,
        eos_token=eos_token)

def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Jinja's `tojson` as transformers defines it for chat templates (plain json.dumps: no
    HTML escaping of `<`, `>`, `&`, `'`)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    """The `raise_exception` transformers gives chat templates (a template refusing input)."""
    raise ValueError(message)
